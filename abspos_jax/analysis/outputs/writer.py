"""Writing an analysis: ``summary.json``, ``stats.npz``, figures and ``report.md``, all or nothing.

Everything goes to a temporary directory first, which then replaces ``out``
(one rename locally; in an object store an upload with ``summary.json`` last,
the directory's marker: :func:`abspos_jax.storage.directory`), so a crash
mid-way leaves any previous results intact.
"""

import json
import os
import tempfile
import uuid

import jax
import numpy as np

from abspos_jax import storage
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.outputs import figures, report


MARKER = "summary.json"  # written last: an analysis directory with it is complete


def check_writable(out: str) -> None:
  """Fail early (before any compute) if ``out``'s parent cannot take a new directory (or the bucket an object)."""
  if storage.is_remote(out):
    probe = storage.join(out, f".write-test-{uuid.uuid4().hex}")
    try:
      storage.write_text(probe, "")
      storage.path(probe).unlink()
    except Exception as e:  # gcsfs and the HTTP stack raise many types for a missing bucket or permission
      raise PermissionError(f"--out {out}: cannot write there ({type(e).__name__}: {e})") from e
    return
  parent = os.path.dirname(os.path.abspath(out)) or "."
  try:
    os.makedirs(parent, exist_ok=True)
    tempfile.TemporaryDirectory(dir=parent).cleanup()
  except OSError as e:
    raise PermissionError(f"--out {out}: cannot write there ({e.strerror})") from e


def write(out: str, summary: dict, stats: dict, meta: dict) -> None:
  """Write everything (process 0 only: in a multi-process run every process holds the same results)."""
  if jax.process_index() != 0:
    return
  with storage.directory(out, ".analysis-", marker=MARKER) as tmp:
    with open(os.path.join(tmp, "summary.json"), "w") as f:
      json.dump({"meta": meta, **summary}, f, indent=1)
    np.savez_compressed(os.path.join(tmp, "stats.npz"), **stats)
    names = figures.all_figures(summary, stats, tmp, AnalysisOptions.from_dict(meta.get("options", {})))
    with open(os.path.join(tmp, "report.md"), "w") as f:
      f.write(report.render(summary, meta, names))
