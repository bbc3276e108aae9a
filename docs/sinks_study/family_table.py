"""The family numbers of docs/results.md's precondition and verdict tables, from the summaries beside this file.

    python docs/sinks_study/family_table.py [L4|L8]   # default L4

One row per position scheme over its seeds (``<scheme>-<depth>-s<seed>.summary.json``): how many runs have sink
heads and which, then each headline number as its mean over seeds with the 95% t-interval over seeds
(mean +- t(0.975, n-1) sd / sqrt(n); 4.30 for 3 seeds), and the per-run checks the verdicts quote. Then the
per-layer denominator picture: mean +- sd over seeds of the slope of log Z on log|V(i)|, the excess of log Z over
log|V(i)| and the max attention weight (``denominators.*_layer``).
"""

import glob
import json
import os
import re
import sys

import numpy as np

from abspos_jax.analysis.estimators import intervals
from abspos_jax.analysis.outputs import schema

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMES = ("rope", "ntk", "swa", "nope")
EARLY_BOS = (*schema.BOS_REPLACE, "mean", "residual_stream_change_early")
NUMBERS = (("max sink score", schema.SINK_SCORE_MAX), ("leakage of log a", schema.LEAKAGE_LOG_WEIGHTS),
           ("causal-mask share", (*schema.POOLED, "causal_mask")),
           ("residual share", (*schema.POOLED, "residual_stream")),
           ("early residual share", (*schema.POOLED_EARLY, "residual_stream")),
           ("BOS-replace[mean] early residual change", EARLY_BOS))


def t_interval(values: list[float]) -> str:
  v = np.array([x for x in values if x is not None], float)
  if len(v) < 2:
    return "n/a" if not len(v) else f"{v[0]:.3f}"
  half = float(intervals.seed_half_width(v))
  return f"{v.mean():.3f} [{v.mean() - half:.3f}, {v.mean() + half:.3f}]"


def family(scheme: str, depth: str) -> list[tuple[str, dict]]:
  runs = []
  for path in sorted(glob.glob(os.path.join(HERE, f"{scheme}-{depth}-s*.summary.json"))):
    name = os.path.basename(path).removesuffix(".summary.json")
    if re.fullmatch(rf"{scheme}-{depth}-s\d+", name):
      with open(path) as f:
        runs.append((name, json.load(f)))
  return runs


def main() -> None:
  depth = sys.argv[1] if len(sys.argv) > 1 else "L4"
  print("| family | runs with sink heads | sink heads per run | " + " | ".join(n for n, _ in NUMBERS)
        + " | runs whose leakage interval excludes 0 | max BOS fingerprint | max closedness |")
  print("|" + "---|" * (len(NUMBERS) + 6))
  for scheme in SCHEMES:
    runs = family(scheme, depth)
    if not runs:
      continue
    heads = [schema.get(s, schema.SINK_HEADS) for _, s in runs]
    listed = "; ".join(" ".join(f"({l},{h})" for l, h in hs) or "none" for hs in heads)
    cells = [t_interval([schema.get(s, path) for _, s in runs]) for _, path in NUMBERS]
    leak = sum(schema.interval(s, schema.LEAKAGE_LOG_WEIGHTS)[0] > 0 for _, s in runs)
    fp = max(max(schema.get(s, schema.FINGERPRINT_BOS)) for _, s in runs)
    closed = max(schema.get(s, schema.CLOSEDNESS) for _, s in runs)
    print(f"| {scheme} {depth} | {sum(bool(h) for h in heads)} of {len(runs)} | {listed} | " + " | ".join(cells)
          + f" | {leak} of {len(runs)} | {fp:.3g} | {closed:.3g} |")
  print("\n| family | slope of log Z on log\\|V(i)\\|, per layer | excess, per layer | max weight, per layer |")
  print("|---|---|---|---|")
  for scheme in SCHEMES:
    runs = family(scheme, depth)
    if runs:
      d = [schema.get(s, schema.DENOMINATORS) for _, s in runs]
      cells = []
      for key in ("log_z_slope_layer", "excess_mean_layer", "max_weight_mean_layer"):
        v = np.array([x[key] for x in d], float)  # [run, layer]
        cells.append(", ".join(f"{m:.2f}\u00b1{sd:.2f}" for m, sd in zip(v.mean(0), v.std(0, ddof=1))))
      print(f"| {scheme} {depth} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
