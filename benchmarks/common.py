"""Shared pieces of the benchmark scripts: machine description, interleaved timing, tables.

Timing is interleaved: every repeat runs each contender once, in an order that
alternates between repeats, and the reported figure is the median over
repeats. On a shared machine, load that comes and goes then hits every side
alike, so the ratio stays meaningful even when absolute numbers drift.
"""

import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping

import numpy as np


def machine() -> dict:
  """Date, CPU model, core count, load average and library versions, for the record."""
  model = platform.processor() or "unknown"
  try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
      if line.startswith("Model name:"):
        model = line.split(":", 1)[1].strip()
  except (OSError, subprocess.CalledProcessError):
    pass
  import jax
  info = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model,
          "cores": os.cpu_count(), "load_avg": [round(x, 2) for x in os.getloadavg()],
          "jax": jax.__version__, "backend": jax.default_backend(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
  try:
    import torch
    info["torch"] = torch.__version__
    info["torch_threads"] = torch.get_num_threads()
  except ImportError:
    pass
  return info


def interleaved(contenders: Mapping[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
  """Seconds per call of each contender, ``repeats`` times, alternating the order each repeat."""
  names = list(contenders)
  times: dict[str, list[float]] = {n: [] for n in names}
  for r in range(repeats):
    for name in (names if r % 2 == 0 else names[::-1]):
      t0 = time.perf_counter()
      contenders[name]()
      times[name].append(time.perf_counter() - t0)
  return times


def median(xs: list[float]) -> float:
  return float(np.median(xs))


def markdown_table(header: list[str], rows: list[list]) -> str:
  """A GitHub-flavoured Markdown table; floats with 3 significant digits (ratios 2 decimals)."""
  def fmt(x) -> str:
    if isinstance(x, float):
      return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
    return str(x)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(fmt(x) for x in row) + " |" for row in rows]
  return "\n".join(lines)


def write_json(path: str, record: dict) -> None:
  if path:
    with open(path, "w") as f:
      json.dump(record, f, indent=1)
