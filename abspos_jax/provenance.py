"""What produced a result: the code, the library versions, the machine, the command and the time.

Every output records it, as levanter logs the git commit with a run and
big_vision writes its config and versions to the workdir:

- a run directory: ``provenance.json``, one entry per start or resume of
  training (:func:`record_training`), and ``metrics.jsonl``'s first record of
  each session (``provenance``);
- an analysis: ``summary.json``'s ``meta.provenance`` (its own entry and the
  trained run's entries) and a line of ``report.md``; for an imported
  checkpoint also the fingerprints of the files it read (:func:`file_fingerprint`).

:func:`code_id` names the code an entry was made with (``git:abc1234`` or
``git:abc1234+dirty`` from a checkout, ``abspos_jax 0.1.0`` otherwise);
comparisons warn when the runs they combine differ in it (:func:`mixed`).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import logging
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping

from abspos_jax import storage

HASH_LIMIT = 256 * 2**20  # files up to this size are hashed; larger ones are named by size and mtime
FILE = "provenance.json"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")
UNKNOWN = "unknown (made before provenance was recorded)"

log = logging.getLogger("abspos_jax")


def file_fingerprint(path: str) -> dict:
  """``{"bytes", "mtime", "sha256"}`` of a local file; ``sha256`` only up to :data:`HASH_LIMIT` bytes
  (hashing a multi-GB checkpoint would cost more than the analysis of a short text)."""
  stat = os.stat(path)
  out = {"bytes": stat.st_size, "mtime": stat.st_mtime}
  if stat.st_size <= HASH_LIMIT:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      for chunk in iter(lambda: f.read(1 << 20), b""):
        digest.update(chunk)
    out["sha256"] = digest.hexdigest()
  return out


def _git(*args: str) -> str | None:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    r = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return r.stdout.strip() if r.returncode == 0 else None


@functools.cache
def code() -> dict:
  """``{"git_commit", "git_dirty", "package_version"}``: the checkout the package runs from (commit and
  whether tracked files differ from it), else None for both; the installed package version always."""
  try:
    version = importlib.metadata.version("abspos_jax")
  except importlib.metadata.PackageNotFoundError:
    version = None
  commit = _git("rev-parse", "HEAD")
  dirty = None if commit is None else bool(_git("status", "--porcelain", "--untracked-files=no"))
  return {"git_commit": commit, "git_dirty": dirty, "package_version": version}


# Read when the package is imported: the record names the code this process loaded, not the checkout at the time a
# result is written (an hour-long analysis outlives edits and commits made beside it).
code()


def code_id(entry: Mapping | None) -> str:
  """A short name of the code of a provenance entry (or of a ``code()`` dict)."""
  if not entry:
    return UNKNOWN
  c = entry.get("code", entry)
  if c.get("git_commit"):
    return f"git:{c['git_commit'][:10]}" + ("+dirty" if c.get("git_dirty") else "")
  return f"abspos_jax {c.get('package_version')}"


def versions() -> dict:
  out = {"python": platform.python_version()}
  for name in PACKAGES:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def machine() -> dict:
  import jax

  devices = jax.devices()
  return {"backend": jax.default_backend(), "device_kind": devices[0].device_kind, "device_count": len(devices),
          "local_device_count": jax.local_device_count(), "process_count": jax.process_count(),
          "platform": f"{platform.system()} {platform.machine()}", "cpu_count": os.cpu_count()}


def entry(event: str, **extra) -> dict:
  """One provenance entry: ``event`` (``train``, ``resume``, ``analysis``), the code, versions, machine, the
  command line and the UTC time, plus ``extra`` (e.g. the step a resume started from)."""
  return {"event": event, "code": code(), "versions": versions(), "machine": machine(),
          "command": shlex.join(sys.argv), "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds"), **extra}


def read(workdir: str) -> list[dict]:
  """The entries of ``workdir/provenance.json`` (empty for a run trained before they were recorded)."""
  path = storage.join(workdir, FILE)
  return storage.read_json(path) if storage.path(path).exists() else []


def record_training(workdir: str, start_step: int, label: str = "", **extra) -> dict:
  """Record a start (``start_step`` 0: the file is begun anew) or a resume (appended) of training in
  ``workdir``, with ``extra`` (e.g. the attention kernel chosen). A resume with other code than the last
  entry's is allowed, and the log says so. Call on process 0 only. Returns the new entry."""
  new = entry("resume" if start_step else "train", step=int(start_step), **extra)
  entries = read(workdir) if start_step else []
  if start_step:
    before = code_id(entries[-1]) if entries else UNKNOWN
    if before != code_id(new):
      log.warning("resuming %s%s from step %d with different code: trained so far by %s, now %s", workdir, label,
                  start_step, before, code_id(new))
  storage.write_json(storage.join(workdir, FILE), entries + [new], indent=1, sort_keys=False)
  return new


def analysis(workdir: str | None = None) -> dict:
  """``meta.provenance`` of an analysis: its own entry and, for a run, the run's training entries."""
  return {"analysis": entry("analysis"), "training": read(workdir) if workdir else None}


def codes(meta: Mapping) -> dict[str, set[str]]:
  """``{"trained": {...}, "analysed": {...}}``: the code ids a summary's ``meta`` names (``UNKNOWN`` when it
  records none)."""
  p = meta.get("provenance")
  if not p:
    return {"trained": {UNKNOWN}, "analysed": {UNKNOWN}}
  training = p.get("training")
  trained = {code_id(e) for e in training} if training else ({UNKNOWN} if training is not None else set())
  return {"trained": trained, "analysed": {code_id(p.get("analysis"))}}


def analysed_here(meta: Mapping) -> bool:
  """Whether a summary's ``meta`` was analysed by the code this process runs (what a rerun may keep)."""
  return codes(meta)["analysed"] == {code_id(code())}


def mixed(metas: Mapping[str, Mapping]) -> list[str]:
  """Warnings, one per kind (trained, analysed), when the runs ``{name: summary meta}`` differ in the code that
  trained or analysed them; each lists which runs used which code. Empty when they agree."""
  out = []
  for kind in ("trained", "analysed"):
    by_code: dict[str, list[str]] = {}
    for name, meta in metas.items():
      for c in codes(meta)[kind]:
        by_code.setdefault(c, []).append(name)
    if len(by_code) > 1:
      out.append(f"the runs were {kind} by different code versions: "
                 + "; ".join(f"{c}: {', '.join(names)}" for c, names in sorted(by_code.items())))
  return out


def describe(p: Mapping | None) -> str:
  """report.md's line: which code analysed (and trained) this, with which jax / flax, on what, when."""
  if not p:
    return UNKNOWN
  a = p["analysis"]
  v, m = a["versions"], a["machine"]
  text = (f"analysed by {code_id(a)} (jax {v['jax']}, flax {v['flax']}) on {m['device_count']} {m['backend']} "
          f"device(s) ({m['device_kind']}), {a['time']}")
  training = p.get("training")
  if training is not None:
    text += "; trained by " + (", then ".join(f"{code_id(e)} ({e['event']} at step {e.get('step', 0)}, "
                                              f"{e['time']})" for e in training) if training else UNKNOWN)
  return text
