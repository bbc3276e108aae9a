"""Where run files live: a local disk or an object store (``gs://``), through one path library, and
all-or-nothing writes on both.

Paths are ``str``; a URI with a scheme (``gs://bucket/dir``) is an object-store
path and goes through ``etils.epath`` (fsspec's ``gcsfs`` for ``gs://``), a
plain path is the local file system, unchanged. Object stores have no atomic
rename, so each kind of store gets the protocol that fits it:

- one file (``write_text``, ``write_json``, ``write_bytes``, ``save_figure``):
  locally a temporary sibling renamed over the target; in an object store a
  single object upload, which becomes visible only once complete;
- a directory of results (``directory``): locally a temporary sibling
  directory renamed into place; in an object store the files are filled in a
  local temporary directory, the target's marker object (for an analysis its
  ``summary.json``) is deleted first, the other objects uploaded, and the
  marker uploaded last, so a reader that finds the marker finds a complete
  directory;
- checkpoints: orbax's own protocol (a temporary directory renamed locally;
  in an object store the step directory plus ``commit_success.txt`` last,
  and only steps with that marker are listed).
"""

import contextlib
import io
import json
import os
import shutil
import tempfile
import urllib.parse
from collections.abc import Iterator

import fsspec
from etils import epath

# Other processes write the same bucket (a sweep's runs, the workers of a pod): list it afresh every time
# rather than from gcsfs's listing cache, which would hide their new checkpoints and analyses.
fsspec.config.conf.setdefault("gcs", {})["use_listings_cache"] = False


def is_remote(path: str) -> bool:
  """Whether ``path`` is an object-store URI (``gs://...``) rather than a local path."""
  return urllib.parse.urlsplit(os.fspath(path)).scheme not in ("", "file")


def path(p: str) -> epath.Path:
  """``p`` as an ``epath.Path`` (local or remote; both have ``exists``, ``iterdir``, ``read_text``, ...)."""
  return epath.Path(p)


def join(base: str, *parts: str) -> str:
  """``os.path.join`` that also keeps a URI's ``scheme://`` intact."""
  return str(epath.Path(base).joinpath(*parts)) if is_remote(base) else os.path.join(base, *parts)


def absolute(p: str) -> str:
  """``os.path.abspath`` for a local path; a URI is already absolute."""
  return p if is_remote(p) else os.path.abspath(p)


def name(p: str) -> str:
  """The last component of ``p`` (``os.path.basename`` that understands URIs and trailing slashes)."""
  return epath.Path(p).name if is_remote(p) else os.path.basename(os.path.normpath(p))


def makedirs(p: str) -> None:
  """Create directory ``p`` and its parents (a no-op in an object store, which has no directories)."""
  if is_remote(p):
    return
  os.makedirs(p, exist_ok=True)


def read_text(p: str) -> str:
  return epath.Path(p).read_text()


def read_json(p: str):
  return json.loads(read_text(p))


def write_bytes(p: str, data: bytes) -> None:
  """Write ``data`` to ``p`` all or nothing (a temporary file renamed over ``p``, or one object upload)."""
  if is_remote(p):
    epath.Path(p).write_bytes(data)
    return
  tmp = f"{p}.tmp.{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, p)


def write_text(p: str, text: str) -> None:
  write_bytes(p, text.encode())


def write_json(p: str, obj, indent: int = 2, sort_keys: bool = True) -> None:
  write_text(p, json.dumps(obj, indent=indent, sort_keys=sort_keys))


def save_figure(fig, p: str, **savefig_kwargs) -> None:
  """``fig.savefig`` as PNG into ``p`` through :func:`write_bytes` (matplotlib cannot write to a URI)."""
  buf = io.BytesIO()
  fig.savefig(buf, format="png", **savefig_kwargs)
  write_bytes(p, buf.getvalue())


def remove_tree(p: str) -> None:
  """Delete ``p`` and everything below it, if it exists."""
  if is_remote(p):
    if epath.Path(p).exists():
      epath.Path(p).rmtree()
  else:
    shutil.rmtree(p, ignore_errors=True)


def move(src: str, dst: str) -> None:
  """Move file or directory ``src`` to ``dst`` (a copy then a delete in an object store: not atomic there)."""
  if is_remote(src) or is_remote(dst):
    copy_tree(src, dst)
    remove_tree(src)
  else:
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    shutil.move(src, dst)


def copy_tree(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
  """Copy every file below ``src`` to the same relative path below ``dst`` (either may be remote).

  Files whose relative path is in ``skip`` are not copied.
  """
  root = epath.Path(src)
  for rel in _files(root):
    if rel not in skip:
      write_bytes(join(dst, rel), (root / rel).read_bytes())


def _files(root: epath.Path, prefix: str = "") -> list[str]:
  """Relative paths of the files below ``root`` (one listing per directory; no recursive glob on object stores)."""
  out = []
  for child in sorted(root.iterdir(), key=lambda c: c.name):
    rel = f"{prefix}{child.name}"
    out += _files(child, rel + "/") if child.is_dir() else [rel]
  return out


@contextlib.contextmanager
def directory(out: str, prefix: str, marker: str) -> Iterator[str]:
  """Yield a local temporary directory to fill; on success it replaces ``out`` all or nothing.

  Locally the temporary directory is a sibling of ``out`` and replaces it by
  renames. For an object-store ``out`` the files are uploaded after the body
  of the ``with``: ``out/marker`` is deleted first, then the old objects, then
  the new files are uploaded with ``marker`` last (readers take ``marker`` as
  the sign of a complete directory). On any error in the body the temporary
  directory is removed and an existing ``out`` is left as it was.
  """
  remote = is_remote(out)
  parent = tempfile.gettempdir() if remote else os.path.dirname(os.path.abspath(out))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
  try:
    yield tmp
    if remote:
      _upload(tmp, out, marker)
    elif os.path.exists(out):
      old = tempfile.mkdtemp(prefix=prefix + "old-", dir=parent)
      os.replace(out, os.path.join(old, "previous"))
      os.replace(tmp, out)
      shutil.rmtree(old)
    else:
      os.replace(tmp, out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _upload(local: str, out: str, marker: str) -> None:
  target = epath.Path(out)
  if (target / marker).exists():
    (target / marker).unlink()
  remove_tree(out)
  copy_tree(local, out, skip=(marker,))
  write_bytes(join(out, marker), (epath.Path(local) / marker).read_bytes())


def local_staging(root: str, base: str) -> str:
  """A local directory for what must be on a local disk (process logs, Slurm files, the compile cache).

  ``root`` itself when it is local; for ``gs://bucket/dir`` it is
  ``base/gs/bucket/dir``.
  """
  if not is_remote(root):
    return root
  u = urllib.parse.urlsplit(root)
  return os.path.join(base, u.scheme, u.netloc, u.path.strip("/"))
