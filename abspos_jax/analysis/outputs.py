"""Writing an analysis: ``summary.json``, ``stats.npz``, figures and ``report.md``, all or nothing.

Everything goes to a temporary sibling directory first, which then replaces
``out`` in one rename, so a crash mid-way leaves any previous results intact.
"""

import json
import os
import tempfile

import jax
import numpy as np

from abspos_jax import atomic
from abspos_jax.analysis import figures, report


def check_writable(out: str) -> None:
  """Fail early (before any compute) if ``out``'s parent cannot take a new directory."""
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
  with atomic.directory(out, ".analysis-") as tmp:
    with open(os.path.join(tmp, "summary.json"), "w") as f:
      json.dump({"meta": meta, **summary}, f, indent=1)
    np.savez_compressed(os.path.join(tmp, "stats.npz"), **stats)
    names = figures.all_figures(summary, stats, tmp)
    with open(os.path.join(tmp, "report.md"), "w") as f:
      f.write(report.render(summary, meta, names))
