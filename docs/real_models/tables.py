"""The tables of docs/real_models.md, from the summaries committed beside this file.

    python docs/real_models/collect.py   # copy runs/real/<name>/{summary.json,report.md} here (after study.sh)
    python docs/real_models/tables.py    # print the tables

Each value with its 95% delete-one-block jackknife interval over sequence
blocks, as analyze.py wrote it; "n/a" where summary.json gives no value.
"""

import json
import os

from abspos_jax.analysis.outputs import schema

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = ("prose-T128-bos", "prose-T128-nobos", "code-T128-bos", "repeated-T128", "prose-T512-bos",
         "prose-T512-bos-ntk4", "prose-T512-bos-w64", "code-T2048-bos")


def get(s: dict, path: str):
  node = s
  for key in path.split("."):
    node = node[key]
  return node


def ci(s: dict, path: str, digits: int = 3) -> str:
  v, bounds = get(s, path), get(s, path + "_ci")
  if v is None:
    return "n/a"
  if bounds is None or None in bounds:
    return f"{v:.{digits}f} [n/a]"
  return f"{v:.{digits}f} [{bounds[0]:.{digits}f}, {bounds[1]:.{digits}f}]"


def ranges(layers: list[int]) -> str:
  out, start = [], None
  for i, l in enumerate(layers):
    start = l if start is None else start
    if i + 1 == len(layers) or layers[i + 1] != l + 1:
      out.append(str(start) if start == l else f"{start}-{l}")
      start = None
  return ", ".join(out) or "none"


def load() -> dict[str, dict]:
  out = {}
  for name in ORDER:
    path = os.path.join(HERE, name, "summary.json")
    if os.path.exists(path):
      with open(path) as f:
        out[name] = json.load(f)
  return out


Table = tuple[list[str], list[list[str]]]  # header, rows


def overview(runs: dict) -> Table:
  header = ["run", "main policy", "loss (BOS / no BOS)", "sink heads (of 270)", "layers with sink heads",
            "best held-out sink score", "leakage of log a", "causal-mask share", "residual-stream share",
            "early residual-stream share", "widest residual-probe interval"]
  rows = []
  for name, s in runs.items():
    heads, loss = s["sink_heads"], s["loss"]
    widest = max(hi - lo for lo, hi in s["probes"]["residual_r2_ci"])
    rows.append([name, s["main_policy"], f"{loss.get('prepend', float('nan')):.3f} / {loss['none']:.3f}",
                 str(len(heads)), ranges(sorted({l for l, _ in heads})), ci(s, "sink_score_max"),
                 ci(s, "leakage.log_weights_overall"), ci(s, "components.pooled.causal_mask"),
                 ci(s, "components.pooled.residual_stream"), ci(s, "components.pooled_early.residual_stream"),
                 f"{widest:.3f}"])
  return header, rows


def interventions(runs: dict) -> Table:
  rows = []
  for name, s in runs.items():
    for label, r in schema.intervention_rows(s.get("interventions") or {}):
      cells = [f"{ci(r, 'residual_stream_change' + x, 4)} / {ci(r, 'residual_stream_removed' + x, 2)}"
               for x in ("", "_early")]
      rows.append([name, label, *cells])
  return ["run", "intervention", "residual-stream component: change (nats^2) / removed, pooled", "early queries"], rows


def depth_profile(runs: dict) -> Table:
  """The residual-stream share by thirds of depth: does it grow with depth (claim 3)?"""
  rows = []
  for name, s in runs.items():
    if "T512" not in name:
      continue
    res = s["components"]["residual_stream"]
    thirds = [sum(res[i:i + 10]) / 10 for i in (0, 10, 20)]
    unmodified = (s["meta"].get("variant") or {}).get("loss_unmodified")
    loss = f"{s['loss'][s['main_policy']]:.3f}" + (f" ({unmodified:.3f})" if unmodified is not None else "")
    rows.append([name, s["position"], loss, *(f"{t:.3f}" for t in thirds),
                 ci(s, "components.pooled.residual_stream"), str(len(s["sink_heads"]))])
  return ["run", "position", "held-out loss (unmodified)", "residual share, layers 0-9", "10-19", "20-29", "pooled",
          "sink heads"], rows


def sink_rates(runs: dict) -> Table:
  rows = []
  for name, s in runs.items():
    r = s["sink_rate"]
    rows.append([name] + [f"{sum(r[a:b]) / (b - a):.2f}" for a, b in ((0, 3), (3, 10), (10, 12), (12, 30))])
  return ["run", "sink rate, layers 0-2", "3-9", "10-11", "12-29"], rows


def fingerprints(runs: dict) -> Table:
  rows = []
  for name, s in runs.items():
    fp = s["fingerprint"]
    bos = f"{max(fp['bos']):.3g}" if "bos" in fp else "n/a"
    nobos = f"{max(fp['no_bos']):.3f}" if "no_bos" in fp else "n/a"
    rows.append([name, f"{s['closedness_max_abs_diff']:.3g}", bos, nobos, str(fp.get("no_bos_num_groups", "n/a")),
                 f"{max(v for v in s['position0']['norm_ratio'] if v is not None):.1f}"])
  return ["run", "closedness (max change of h_0)", "BOS fingerprint spread (max over depth)", "no-BOS spread (max)",
          "distinct x_0", "position-0 norm ratio (max)"], rows


def main() -> None:
  runs = load()
  for title, table in (("Overview", overview), ("Sink rate by depth", sink_rates),
                       ("Position 0", fingerprints), ("Interventions", interventions),
                       ("Variants at 512 tokens", depth_profile)):
    header, rows = table(runs)
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
      print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
  main()
