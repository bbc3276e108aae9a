"""Emergence over training: the hook's curves against tokens, and the analysis of every kept checkpoint.

* :func:`run_curves` reads the metrics that the training-time emergence hook
  (``analysis/emergence.py``) logs into ``metrics.jsonl``;
  :func:`curves_figure` plots them against training tokens, one panel per
  quantity and one line per run (``analyze.py --compare`` writes it as
  ``emergence.png``).
* :func:`step_record` condenses one checkpoint's ``summary.json`` into the
  numbers that follow sinks forming, with their intervals; :func:`write_steps`
  writes them for every analysed checkpoint of a run as ``steps.json`` and
  ``steps.png`` (error bars from the intervals; ``analyze.py --all_steps``).
"""

import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from abspos_jax import storage  # noqa: E402
from abspos_jax.analysis.outputs import schema  # noqa: E402
from abspos_jax.analysis.outputs.figures import ci_errors  # noqa: E402
from abspos_jax.analysis.options import AnalysisOptions  # noqa: E402
from abspos_jax.metrics import read_metrics  # noqa: E402

# The sink threshold of the emergence hook, which runs with the default options.
EPS = AnalysisOptions.sink_epsilon

# (key in a run's curves, panel title); one panel each in emergence.png.
CURVES = (
    ("sink_rate_max", f"sink rate (eps {EPS}), max over layers"),
    ("sink_score_max", "largest sink score of a head (held out)"),
    ("pos0_norm_ratio_last", "pos-0 / other norm ratio, last layer"),
    ("residual_stream_share", "residual-stream share (pooled)"),
    ("leakage_log_weights", "leakage of log a (held-out R^2 gain)"),
    ("val_loss", "validation loss (nats/token)"),
)


def run_curves(run_dir: str) -> dict[str, list] | None:
  """The emergence curves of a run, or None when its ``metrics.jsonl`` holds none.

  Returns lists over the evaluation records (those with ``sink_score_max``):
  ``step``, ``tokens``, ``sink_rate_max`` and ``sink_rate_mean`` (max and mean
  of ``sink_rate_l{l}`` over layers), ``pos0_norm_ratio_last``
  (``pos0_norm_ratio_l{L}``), and ``sink_score_max``, ``residual_stream_share``,
  ``causal_mask_share``, ``leakage_log_weights``, ``val_loss``,
  ``emergence_fraction`` as logged (None where a value is missing or NaN).
  """
  if not storage.path(storage.join(run_dir, "metrics.jsonl")).exists():
    return None
  records = [r for r in read_metrics(run_dir) if "sink_score_max" in r]
  if not records:
    return None

  def clean(v) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)

  out: dict[str, list] = {k: [] for k in ("step", "tokens", "sink_rate_max", "sink_rate_mean",
                                          "pos0_norm_ratio_last")}
  passthrough = ("sink_score_max", "residual_stream_share", "causal_mask_share", "leakage_log_weights", "val_loss",
                 "emergence_fraction")
  out.update({k: [] for k in passthrough})
  for r in records:
    rates = np.array([v for k, v in r.items() if k.startswith("sink_rate_l")], float)
    ratios = sorted((int(k[len("pos0_norm_ratio_l"):]), v) for k, v in r.items() if k.startswith("pos0_norm_ratio_l"))
    out["step"].append(int(r["step"]))
    out["tokens"].append(clean(r.get("tokens")))
    out["sink_rate_max"].append(clean(rates.max()) if rates.size else None)
    out["sink_rate_mean"].append(clean(rates.mean()) if rates.size else None)
    out["pos0_norm_ratio_last"].append(clean(ratios[-1][1]) if ratios else None)
    for k in passthrough:
      out[k].append(clean(r.get(k)))
  return out


def _values(x: list) -> np.ndarray:
  return np.array([np.nan if v is None else v for v in x], float)


def _styles(labels: list[str]) -> dict[str, tuple[str, str]]:
  """A colour per family (the label without its ``-s<seed>`` suffix) and a line style per seed within it."""
  families: dict[str, int] = {}
  style = {}
  for label in labels:
    family = re.sub(r"-s\d+$", "", label)
    families.setdefault(family, len(families))
    seeds_seen = sum(1 for other in style if re.sub(r"-s\d+$", "", other) == family)
    style[label] = (f"C{families[family] % 10}", ("-", "--", ":", "-.")[seeds_seen % 4])
  return style


def _robust_ylim(ax, arrays: list[np.ndarray]) -> None:
  """Clip the y-axis to the 2-98% range of the values (plus a margin) so that one near-singular point keeps the
  rest readable; the share of a component whose variance is tiny on one evaluation batch can be -300."""
  v = np.concatenate([a[np.isfinite(a)] for a in arrays] or [np.zeros(0)])
  if v.size:
    lo, hi = np.percentile(v, [2, 98])
    pad = 0.2 * (hi - lo) or 0.1
    ax.set_ylim(lo - pad, hi + pad)


def curves_figure(curves: dict[str, dict[str, list]], path: str) -> None:
  """``emergence.png``: one panel per :data:`CURVES` entry against training tokens, one line per run (its label);
  runs of one family share a colour, seeds differ by line style; the residual-stream share is clipped to its
  2-98% range."""
  cols = 3
  rows = -(-len(CURVES) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
  names = {label: storage.name(label) or label for label in curves}  # the readable part
  styles = _styles(list(names.values()))
  for ax, (key, title) in zip(axes.flat, CURVES):
    for label, c in curves.items():
      color, ls = styles[names[label]]
      ax.plot(_values(c["tokens"]), _values(c[key]), marker="o", ls=ls, color=color, ms=3, lw=1.2,
              label=names[label])
    if key == "residual_stream_share":
      _robust_ylim(ax, [_values(c[key]) for c in curves.values()])
      title += ", 2-98% range"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training tokens")
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
  for ax in list(axes.flat)[len(CURVES):]:
    ax.axis("off")
  axes[0, 0].set_ylim(-0.05, 1.05)  # a fraction of heads
  axes[0, 1].axhline(EPS, color="k", ls="--", lw=0.8)  # the sink-head threshold epsilon
  handles, labels = axes[0, 0].get_legend_handles_labels()
  fig.suptitle("Emergence during training (fixed validation batch at every evaluation)")
  fig.tight_layout()
  fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)  # beside the panels
  storage.save_figure(fig, path, dpi=110, bbox_inches="tight")
  plt.close(fig)


def step_record(step: int, summary: dict, tokens_per_step: int | None = None) -> dict:
  """The numbers of checkpoint ``step``'s analysis (its ``summary.json``) that ``steps.json`` tracks.

  ``step``, ``tokens`` (``step * tokens_per_step``, None without it) and the
  numbers of :func:`summary_record`.
  """
  tokens = None if tokens_per_step is None else step * tokens_per_step
  return {"step": step, "tokens": tokens, **summary_record(summary)}


def summary_record(summary: dict) -> dict:
  """``leakage_log_weights``, pooled ``causal_mask_share``, ``residual_stream_share``, ``leakage_share`` and their
  ``*_early`` variants, ``sink_score_max``, ``sink_rate`` (per layer) and, when BOS replacement ran,
  ``bos_replace``: per replacement kind the ``residual_stream`` and ``causal_mask`` ``_change`` (after - before
  covariance, nats^2) and ``_removed`` (a fraction, None where the component before is not clearly non-zero), all
  and early queries. Each number that summary.json gives an interval has it beside it as ``KEY_ci`` (``[lo,
  hi]``, None where the summary has none)."""
  rec = {}
  for name, path in (("leakage_log_weights", schema.LEAKAGE_LOG_WEIGHTS), ("sink_score_max", schema.SINK_SCORE_MAX)):
    rec[name], rec[name + "_ci"] = schema.get(summary, path), schema.interval(summary, path)
  rec["sink_rate"] = schema.get(summary, schema.SINK_RATE)
  for suffix, pooled in (("", schema.POOLED), ("_early", schema.POOLED_EARLY)):
    for name, key in (("causal_mask_share", "causal_mask"), ("residual_stream_share", "residual_stream"),
                      ("leakage_share", "leakage_share")):
      rec[name + suffix] = schema.get(summary, (*pooled, key))
      rec[f"{name}{suffix}_ci"] = schema.interval(summary, (*pooled, key))
  kinds = schema.get(summary, schema.BOS_REPLACE, {})
  if any(isinstance(v, dict) for v in kinds.values()):
    rec["bos_replace"] = {kind: {f"{comp}_{what}{suffix}{ci}": v.get(f"{comp}_{what}{suffix}{ci}")
                                 for comp in ("residual_stream", "causal_mask") for what in ("change", "removed")
                                 for suffix in ("", "_early") for ci in ("", "_ci")}
                          for kind, v in kinds.items() if isinstance(v, dict)}
  return rec


def plot_ci(ax, x, records: list[dict], key: str, fmt: str, **kw) -> None:
  """``records[i][key]`` against ``x`` with error bars from ``records[i][key + "_ci"]`` where there is one."""
  values = _values([r.get(key) for r in records])
  ax.errorbar(x, values, yerr=ci_errors(values, [r.get(key + "_ci") for r in records]), fmt=fmt, ms=3, capsize=2,
              **kw)


def plot_record_panels(axes, x, records: list[dict]) -> None:
  """Three panels of :func:`summary_record` s against ``x``: the pooled and early causal-mask / residual-stream
  shares, the leakage of log a, and the sinks (largest sink score, largest sink rate), with their intervals."""
  for comp, color in (("causal_mask", "C0"), ("residual_stream", "C1")):
    for suffix, ls in (("", "-"), ("_early", "--")):
      label = comp.replace("_", " ") + (" (early queries)" if suffix else " (all queries)")
      plot_ci(axes[0], x, records, f"{comp}_share{suffix}", "o" + ls, color=color, label=label)
  axes[0].axhline(0.0, color="k", lw=0.6)
  axes[0].set_title("share of query-position leakage of log a", fontsize=9)
  plot_ci(axes[1], x, records, "leakage_log_weights", "o-", label="held-out R^2 gain")
  plot_ci(axes[1], x, records, "leakage_share", "o--", label="Var(phi_loga) / Var(log a)")
  axes[1].set_title("leakage of log a (pooled)", fontsize=9)
  plot_ci(axes[2], x, records, "sink_score_max", "o-", label="largest sink score (held out)")
  axes[2].plot(x, [np.nanmax(_values(r["sink_rate"])) for r in records], "o--", ms=3,
               label="sink rate, max over layers")
  axes[2].axhline(EPS, color="k", ls=":", lw=0.8)
  axes[2].set_title(f"sinks (threshold {EPS} dotted)", fontsize=9)
  for ax in axes:
    ax.legend(fontsize=7)


def write_steps(out: str, records: list[dict], workdir: str) -> None:
  """``steps.json`` (``{"workdir", "steps": [step_record, ...]}``, by step) and ``steps.png`` into ``out``.

  Error bars: the summary's intervals (``*_ci``, delete-one-block jackknife, 95%).
  """
  records = sorted(records, key=lambda r: r["step"])
  storage.write_json(storage.join(out, "steps.json"), {"workdir": storage.absolute(workdir), "steps": records},
                     indent=1, sort_keys=False)
  step = np.array([r["step"] for r in records])
  has_iv = all("bos_replace" in r and "mean" in r["bos_replace"] for r in records)
  fig, axes = plt.subplots(1, 4 if has_iv else 3, figsize=(17 if has_iv else 13, 3.4))
  plot_record_panels(axes[:3], step, records)
  if has_iv:
    mean = [r["bos_replace"]["mean"] for r in records]
    for suffix, ls in (("", "-"), ("_early", "--")):
      plot_ci(axes[3], step, mean, f"residual_stream_change{suffix}", "o" + ls, color="C1",
               label="all queries" if not suffix else "early queries")
    axes[3].axhline(0.0, color="k", lw=0.6)
    axes[3].set_title("BOS-replace[mean]: change of the residual-stream\ncomponent (after - before, nats^2)",
                      fontsize=9)
    axes[3].legend(fontsize=7)
  for ax in axes:
    ax.set_xlabel("training step")
  fig.suptitle(f"Analysis of every kept checkpoint of {workdir} (error bars: 95% jackknife intervals)")
  fig.tight_layout()
  storage.save_figure(fig, storage.join(out, "steps.png"), dpi=110)
  plt.close(fig)
