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
         "prose-T512-bos-ntk4", "prose-T512-bos-w64", "mixed-T2048-bos")


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


def overview(runs: dict) -> None:
  print("| run | main policy | loss (BOS / no BOS) | sink heads (of 270) | layers with sink heads | best held-out sink "
        "score | leakage of log a | causal-mask share | residual-stream share | early residual-stream share | "
        "widest residual-probe interval |")
  print("|" + "---|" * 11)
  for name, s in runs.items():
    heads = s["sink_heads"]
    probe = s["probes"]["residual_r2_ci"]
    widest = max(hi - lo for lo, hi in probe)
    loss = s["loss"]
    print(f"| {name} | {s['main_policy']} | {loss.get('prepend', float('nan')):.3f} / {loss['none']:.3f} | "
          f"{len(heads)} | {ranges(sorted({l for l, _ in heads}))} | {ci(s, 'sink_score_max')} | "
          f"{ci(s, 'leakage.log_weights_overall')} | {ci(s, 'components.pooled.causal_mask')} | "
          f"{ci(s, 'components.pooled.residual_stream')} | {ci(s, 'components.pooled_early.residual_stream')} | "
          f"{widest:.3f} |")


def interventions(runs: dict) -> None:
  print("| run | intervention | residual-stream component: change (nats^2) / removed, pooled | early queries |")
  print("|---|---|---|---|")
  for name, s in runs.items():
    iv = s.get("interventions")
    if not iv:
      continue
    for label, r in schema.intervention_rows(iv):
      cells = []
      for suffix in ("", "_early"):
        change = ci(r, f"residual_stream_change{suffix}", 4)
        removed = ci(r, f"residual_stream_removed{suffix}", 2)
        cells.append(f"{change} / {removed}")
      print(f"| {name} | {label} | {cells[0]} | {cells[1]} |")


def depth_profile(runs: dict) -> None:
  """The residual-stream share by thirds of depth: does it grow with depth (claim 3)?"""
  print("| run | position | held-out loss (unmodified) | residual share, layers 0-9 | 10-19 | 20-29 | pooled | sink "
        "heads |")
  print("|---|---|---|---|---|---|---|---|")
  for name, s in runs.items():
    if "T512" not in name:
      continue
    res = s["components"]["residual_stream"]
    thirds = [sum(res[i:i + 10]) / 10 for i in (0, 10, 20)]
    variant = s["meta"].get("variant") or {}
    unmodified = variant.get("loss_unmodified")
    loss = f"{s['loss'][s['main_policy']]:.3f}" + (f" ({unmodified:.3f})" if unmodified is not None else "")
    print(f"| {name} | {s['position']} | {loss} | {thirds[0]:.3f} | {thirds[1]:.3f} | {thirds[2]:.3f} | "
          f"{ci(s, 'components.pooled.residual_stream')} | {len(s['sink_heads'])} |")


def sink_rates(runs: dict) -> None:
  print("| run | sink rate, layers 0-2 | 3-9 | 10-11 | 12-29 |")
  print("|---|---|---|---|---|")
  for name, s in runs.items():
    r = s["sink_rate"]
    mean = lambda a, b: sum(r[a:b]) / (b - a)  # noqa: E731
    print(f"| {name} | {mean(0, 3):.2f} | {mean(3, 10):.2f} | {mean(10, 12):.2f} | {mean(12, 30):.2f} |")


def fingerprints(runs: dict) -> None:
  print("| run | closedness (max change of h_0) | BOS fingerprint spread (max over depth) | no-BOS spread (max) | "
        "distinct x_0 | position-0 norm ratio (max) |")
  print("|---|---|---|---|---|---|")
  for name, s in runs.items():
    fp = s["fingerprint"]
    bos = max(fp["bos"]) if "bos" in fp else None
    nobos = max(fp["no_bos"]) if "no_bos" in fp else None
    print(f"| {name} | {s['closedness_max_abs_diff']:.3g} | {'n/a' if bos is None else f'{bos:.3g}'} | "
          f"{'n/a' if nobos is None else f'{nobos:.3f}'} | {fp.get('no_bos_num_groups', 'n/a')} | "
          f"{max(v for v in s['position0']['norm_ratio'] if v is not None):.1f} |")


def main() -> None:
  runs = load()
  for title, table in (("Overview", overview), ("Sink rate by depth", sink_rates),
                       ("Position 0", fingerprints), ("Interventions", interventions),
                       ("Variants at 512 tokens", depth_profile)):
    print(f"\n### {title}\n")
    table(runs)


if __name__ == "__main__":
  main()
