"""Per-run table of the sinks study, from the summaries committed beside this file.

    python docs/sinks_study/runs_table.py > /tmp/table.md

Each value with its 95% delete-one-block jackknife interval over sequence
blocks, as analyze.py wrote it; "n/a" where summary.json gives no value (a
removed fraction whose component before is not clearly non-zero). The last
column names the code that trained and analysed the run (``meta.provenance``).
"""

import glob
import json
import os

from abspos_jax import provenance


def ci(s: dict, path: str, digits: int = 3) -> str:
  node = s
  *parents, leaf = path.split(".")
  for p in parents:
    node = node[p]
  v, (lo, hi) = node[leaf], node[leaf + "_ci"]
  if v is None:
    return "n/a"
  return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def row(name: str, s: dict) -> list[str]:
  heads = " ".join(f"({l},{h})" for l, h in s["sink_heads"]) or "none"
  bos = "interventions.bos_replace.mean."
  return [name, heads, ci(s, "sink_score_max"), ci(s, "leakage.log_weights_overall", 4),
          ci(s, "components.pooled.residual_stream"), ci(s, "components.pooled_early.residual_stream"),
          ci(s, bos + "residual_stream_change_early") + " / " + ci(s, bos + "residual_stream_removed_early", 2),
          f'{s["loss"]["prepend"]:.3f} / {s["loss"]["none"]:.3f}', code(s)]


def code(s: dict) -> str:
  """The code that trained and analysed the run (``meta.provenance``); summaries from before provenance was
  recorded say so."""
  c = provenance.codes(s.get("meta", {}))
  trained, analysed = ", ".join(sorted(c["trained"])), ", ".join(sorted(c["analysed"]))
  if trained == analysed == provenance.UNKNOWN:
    return "not recorded (older code)"
  return trained if trained == analysed else f"trained {trained}, analysed {analysed}"


def main() -> None:
  here = os.path.dirname(os.path.abspath(__file__))
  order = {"rope": 0, "ntk": 1, "swa": 2, "nope": 3}
  paths = glob.glob(os.path.join(here, "*.summary.json"))
  names = sorted((os.path.basename(p).removesuffix(".summary.json") for p in paths),
                 key=lambda n: (n.split("-")[1], order[n.split("-")[0]], n))
  print("| run | sink heads (layer, head) | held-out max sink score | leakage of log a | pooled residual-stream "
        "share | early residual-stream share | BOS-replace[mean]: early residual change (nats^2) / removed | "
        "loss (BOS / no BOS) | code |")
  print("|" + "---|" * 9)
  for n in names:
    with open(os.path.join(here, n + ".summary.json")) as f:
      print("| " + " | ".join(row(n, json.load(f))) + " |")


if __name__ == "__main__":
  main()
