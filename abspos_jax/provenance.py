"""What produced a result: the files an analysis read (and, for runs, the code and machine)."""

import hashlib
import os

HASH_LIMIT = 256 * 2**20  # files up to this size are hashed; larger ones are named by size and mtime


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
