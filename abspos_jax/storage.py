"""All-or-nothing writes: a file or a whole directory appears complete or not at all."""

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator


def write_json(path: str, obj) -> None:
  """``json.dump`` to a temporary file, then rename over ``path``."""
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


@contextlib.contextmanager
def directory(out: str, prefix: str) -> Iterator[str]:
  """Yield a temporary sibling of ``out`` to fill; on success it replaces ``out`` by renames.

  On any error the temporary directory is removed and an existing ``out`` is left as it was.
  """
  parent = os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
  try:
    yield tmp
    if os.path.exists(out):
      old = tempfile.mkdtemp(prefix=prefix + "old-", dir=parent)
      os.replace(out, os.path.join(old, "previous"))
      os.replace(tmp, out)
      shutil.rmtree(old)
    else:
      os.replace(tmp, out)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
