"""Side-by-side comparison of analysed runs, with spread over seeds.

Runs whose configs differ only in ``train.seed`` form one group; each metric is
reported as mean +- standard deviation (ddof 1) over the group's seeds, and a
group of one run as its value with its summary.json interval (``KEY_ci``). Runs
whose ``metrics.jsonl`` holds the training-time emergence metrics also get
their curves against training tokens (``emergence.png``, and per group under
``emergence`` in ``comparison.json``; see ``analysis/curves.py``). Runs trained
or analysed by different code versions are named in a warning (logged, first
in comparison.md, and in the family figures' titles).
"""

import logging

import numpy as np

from abspos_jax import config as config_lib
from abspos_jax import provenance, storage
from abspos_jax.analysis.outputs import curves, family, schema
from abspos_jax.analysis.estimators import intervals

log = logging.getLogger("abspos_jax")

# (name in the table, path into summary.json); a list value is averaged over layers.
METRICS = (
    ("loss", (*schema.LOSS, "MAIN")),
    ("leakage log a", schema.LEAKAGE_LOG_WEIGHTS),
    ("causal-mask share", (*schema.POOLED, "causal_mask")),
    ("residual share", (*schema.POOLED, "residual_stream")),
    ("residual share (early)", (*schema.POOLED_EARLY, "residual_stream")),
    ("pos0 norm ratio (last)", (*schema.POS0_NORM_RATIO, -1)),
    ("BOS fingerprint (max)", (*schema.FINGERPRINT_BOS, "MAX")),
    ("no-BOS fingerprint (mean)", (*schema.FINGERPRINT_NO_BOS, "MEAN")),
    ("max sink score (held out)", schema.SINK_SCORE_MAX),
    ("BOS-replace[mean] residual change (early, nats^2)",
     (*schema.BOS_REPLACE, "mean", "residual_stream_change_early")),
    ("BOS-replace[mean] residual removed (early)", (*schema.BOS_REPLACE, "mean", "residual_stream_removed_early")),
)


def _get_ci(summary: dict, path: tuple) -> list | None:
  """The ``[lo, hi]`` interval summary.json keeps beside a scalar at ``path`` (``KEY_ci``), else None."""
  if not isinstance(path[-1], str) or path[-1].isupper():
    return None
  x = schema.interval(summary, path)
  if not isinstance(x, list) or len(x) != 2 or any(isinstance(v, list) for v in x):
    return None  # a per-layer list of intervals: the table shows scalars
  return [None if v is None or not np.isfinite(v) else float(v) for v in x]


def _get(summary: dict, path: tuple) -> float:
  x = summary
  for key in path:
    if x is None:
      return float("nan")
    if key == "MAIN":
      key = schema.get(summary, schema.MAIN_POLICY)
    if key in ("MAX", "MEAN"):
      v = np.array([np.nan if a is None else a for a in x], float)
      return float(np.nanmax(v) if key == "MAX" else np.nanmean(v))
    try:
      x = x[key]
    except (KeyError, IndexError, TypeError):
      return float("nan")
  return float("nan") if x is None else float(np.nanmean(np.array(x, float)))


def load(run_dir: str) -> tuple[dict, dict]:
  """``(config, summary)`` of a run directory (its ``analysis/`` is read) or an analysis directory."""
  candidates = [storage.join(run_dir, "analysis", "summary.json"), storage.join(run_dir, "summary.json")]
  path = next((p for p in candidates if storage.path(p).exists()), None)
  if path is None:
    raise FileNotFoundError(f"{run_dir}: no summary.json (run `python analyze.py --workdir={run_dir}` first)")
  summary = storage.read_json(path)
  config_path = storage.join(run_dir, "config.json")
  config = storage.read_json(config_path) if storage.path(config_path).exists() else {}
  return config, summary


def group_key(config: dict) -> str:
  if not config:
    return "unknown"
  m = config["model"]
  label = f"{m['position']} L{m['num_layers']} d{m['d_model']}"
  base = dict(config_lib.flatten(config_lib.to_dict(config_lib.base_config())))
  extras = [f"{k}={v}" for k, v in config_lib.flatten(config)
            if k in base and base[k] != v and k not in ("train.seed", "model.position", "model.num_layers",
                                                       "model.d_model") and k not in config_lib.resumable_fields()
            and not k.startswith(("data.data_dir",))]
  return label + (f" [{', '.join(sorted(extras))}]" if extras else "")


def compare(run_dirs: list[str], out: str) -> dict:
  """Write ``comparison.md``, ``comparison.json``, ``comparison.png``, the family figures and numbers
  (``family.json``, ``family_*.png``, see :mod:`abspos_jax.analysis.outputs.family`) and, with curves,
  ``emergence.png`` to ``out``."""
  groups: dict[str, list[dict]] = {}
  for d in run_dirs:
    config, summary = load(d)
    groups.setdefault(group_key(config), []).append({"dir": d, "summary": summary,
                                                     "seed": config.get("train", {}).get("seed")})
  table = {}
  for key, runs in groups.items():
    row = {"runs": [r["dir"] for r in runs], "seeds": [r["seed"] for r in runs],
           "code": {r["dir"]: {k: sorted(v) for k, v in provenance.codes(r["summary"].get("meta", {})).items()}
                    for r in runs}}
    for name, path in METRICS:
      vals = np.array([_get(r["summary"], path) for r in runs])
      row[name] = {"mean": float(np.nanmean(vals)) if np.isfinite(vals).any() else None,
                   "std": float(np.nanstd(vals, ddof=1)) if np.isfinite(vals).sum() > 1 else None,
                   "values": [None if not np.isfinite(v) else float(v) for v in vals],
                   "intervals": [_get_ci(r["summary"], path) for r in runs]}
    by_run = {r["dir"]: curves.run_curves(r["dir"]) for r in runs}
    row["emergence"] = {d: c for d, c in by_run.items() if c is not None}
    table[key] = row
  storage.makedirs(out)
  storage.write_json(storage.join(out, "comparison.json"), table, indent=1, sort_keys=False)
  by_run = {d: c for row in table.values() for d, c in row["emergence"].items()}
  if by_run:
    curves.curves_figure(by_run, storage.join(out, "emergence.png"))
  mixed = provenance.mixed({r["dir"]: r["summary"].get("meta", {}) for runs in groups.values() for r in runs})
  for warning in mixed:
    log.warning("comparison %s: %s", out, warning)
  storage.write_text(storage.join(out, "comparison.md"), render(table, mixed))
  figure(table, storage.join(out, "comparison.png"))
  family.write({key: [r["summary"] for r in runs] for key, runs in groups.items()}, out, mixed)
  return table


def _num(x: float) -> str:
  return f"{x:.3g}" if x != 0 and abs(x) < 1e-2 else f"{x:.3f}"


def _cell(v: dict) -> str:
  if v["mean"] is None:
    return "n/a"
  if len(v["values"]) == 1:  # one run: its own interval
    ci = (v.get("intervals") or [None])[0]
    return _num(v["mean"]) + (f" [{_num(ci[0])}, {_num(ci[1])}]" if ci and None not in ci else "")
  return _num(v["mean"]) + (f" ± {_num(v['std'])}" if v["std"] is not None else "")


def render(table: dict, mixed: list[str] = ()) -> str:
  """comparison.md; ``mixed``: the warnings of :func:`abspos_jax.provenance.mixed`, shown first."""
  names = [n for n, _ in METRICS]
  lines = ["# Comparison", ""]
  for w in mixed:
    lines += [f"**Warning: {w}.** Their numbers may differ because the code did, not the configuration.", ""]
  lines += ["Mean ± std over seeds (n = number of runs); for a single run, its value and 95% "
            "jackknife interval [lo, hi] from summary.json.", "",
           "| group | n | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
  for key, row in table.items():
    lines.append(f"| {key} | {len(row['runs'])} | " + " | ".join(_cell(row[n]) for n in names) + " |")
  text = "\n".join(lines) + "\n\n![comparison](comparison.png)\n"
  if any(row.get("emergence") for row in table.values()):
    text += "\nEmergence metrics logged during training, against tokens:\n\n![emergence](emergence.png)\n"
  return text


def figure(table: dict, path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  keys = list(table)
  fig, ax = plt.subplots(figsize=(min(26, max(5, 1.3 * len(keys))), 3.4))  # at most ~2,900 px wide
  x = np.arange(len(keys))
  for off, name in ((-0.2, "causal-mask share"), (0.2, "residual share")):
    means = np.array([np.nan if table[k][name]["mean"] is None else table[k][name]["mean"] for k in keys])
    errs = np.zeros((2, len(keys)))
    for i, k in enumerate(keys):
      v = table[k][name]
      ci = (v.get("intervals") or [None])[0] if len(v["values"]) == 1 else None
      if len(v["values"]) > 1:
        errs[:, i] = np.nan_to_num(intervals.seed_half_width(np.array(v["values"], float)))
      elif ci and None not in ci and np.isfinite(means[i]):
        errs[:, i] = np.maximum([means[i] - ci[0], ci[1] - means[i]], 0.0)
    ax.bar(x + off, means, 0.4, yerr=errs, capsize=3, label=name)
  ax.axhline(0, color="k", lw=0.8)
  ax.set_xticks(x)
  ax.set_xticklabels(keys, rotation=25, ha="right", fontsize=7)
  ax.set_ylabel("share of query-position leakage")
  ax.set_title("Leakage components by configuration\n(error bars: 95% t-interval over seeds; one run: its 95% "
               "jackknife interval)", fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)
