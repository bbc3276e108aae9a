"""The denominator picture of one run at every kept checkpoint, from the per-step summaries committed beside this file.

    python docs/sinks_study/steps_table.py rope-L4-s0 > /tmp/steps.md

Reads ``RUN.steps.json`` and ``RUN.steps/step_N.summary.json`` (copies of ``analyze.py --all_steps``'s
``analysis_steps/step_N/summary.json``). Per step: the sink heads and the
held-out max sink score (95% jackknife interval), then per layer the slope of
log Z on log|V(i)| (mean over heads), the mean excess log Z - log|V(i)|, and
the mean largest attention weight (sink mass proxy); these three are means over
all queries and the 256 sequences, with no interval in summary.json.
"""

import glob
import json
import os
import re
import sys


def main(run: str) -> None:
  here = os.path.dirname(os.path.abspath(__file__))
  paths = glob.glob(os.path.join(here, f"{run}.steps", "step_*.summary.json"))
  steps = sorted(paths, key=lambda p: int(re.search(r"step_(\d+)", p).group(1)))
  with open(os.path.join(here, f"{run}.steps.json")) as f:
    tokens = {r["step"]: r["tokens"] for r in json.load(f)["steps"]}  # training tokens (analyze.py's record)
  print("| step | tokens | sink heads | max sink score | log Z slope per layer | excess per layer | "
        "max weight per layer |")
  print("|" + "---|" * 7)
  for p in steps:
    with open(p) as f:
      s = json.load(f)
    d = s["denominators"]
    step = s["meta"]["step"]
    lo, hi = s["sink_score_max_ci"]
    heads = " ".join(f"({l},{h})" for l, h in s["sink_heads"]) or "none"
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    print(f"| {step} | {tokens[step] / 1e6:.1f}M | {heads} | "
          f"{s['sink_score_max']:.2f} [{lo:.2f}, {hi:.2f}] | {fmt(d['log_z_slope_layer'])} | "
          f"{fmt(d['excess_mean_layer'])} | {fmt(d['max_weight_mean_layer'])} |")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "rope-L4-s0")
