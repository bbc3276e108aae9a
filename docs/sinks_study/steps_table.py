"""One run at every kept checkpoint, from the records committed beside this file.

    python docs/sinks_study/steps_table.py rope-L4-s0 > /tmp/steps.md   # the denominator picture
    python docs/sinks_study/steps_table.py --headline rope-L4-s0 ntk-L4-s0  # results.md's table across steps

``--headline`` prints, per run and step, from ``RUN.steps.json`` alone: the held-out max sink score, the
leakage of log a, the pooled and early residual-stream shares and the early fraction ``bos_replace[mean]``
removes, each with its 95% jackknife interval ("n/a" where summary.json gives none).

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


def headline(runs: list[str]) -> None:
  here = os.path.dirname(os.path.abspath(__file__))
  print("| run | step (tokens) | held-out max sink score | leakage of log a | pooled residual-stream share | "
        "early residual-stream share | BOS-replace[mean] early removed |")
  print("|" + "---|" * 7)
  for run in runs:
    with open(os.path.join(here, f"{run}.steps.json")) as f:
      records = json.load(f)["steps"]
    for i, r in enumerate(records):
      cells = [_ci(r, "sink_score_max"), _ci(r, "leakage_log_weights"), _ci(r, "residual_stream_share"),
               _ci(r, "residual_stream_share_early"), _ci(r["bos_replace"]["mean"], "residual_stream_removed_early")]
      print(f"| {run if i == 0 else ''} | {r['step']} ({r['tokens'] / 1e6:.1f}M) | " + " | ".join(cells) + " |")


def _ci(record: dict, key: str) -> str:
  v, (lo, hi) = record.get(key), record.get(key + "_ci", (None, None))
  return "n/a" if v is None or lo is None else f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


if __name__ == "__main__":
  if sys.argv[1:2] == ["--headline"]:
    headline(sys.argv[2:])
  else:
    main(sys.argv[1] if len(sys.argv) > 1 else "rope-L4-s0")
