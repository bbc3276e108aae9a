"""Figures and numbers of a model family: per-layer and per-intervention results, mean ± std over seeds.

``analyze.py --compare`` groups analysed runs whose configs differ only in
``train.seed`` (``compare.group_key``). For each group this module reads, from
every run's ``summary.json``:

* ``layers``: per layer, the causal-mask and residual-stream shares
  (``components.causal_mask`` / ``residual_stream`` and their ``_early``
  variants), the sink rate, ``position0.norm_ratio`` (embedding included) and
  the denominator picture (``denominators``: slope of log Z on log|V(i)|,
  excess, max weight, weight on key 0; the last absent from summaries written
  before it existed);
* ``fingerprint``: ``fingerprint.bos`` and ``fingerprint.no_bos`` per depth
  (``L + 1`` entries);
* ``interventions``: per intervention, the fraction of the residual-stream
  component it removes (``pooled``, ``early``; null in a run where the
  component before is not clearly non-zero, so a mean is over the runs that
  have one) and the change of that component (after - before covariance,
  nats^2: ``change``, ``change_early``).

and writes ``family.json`` (means, stds over seeds with ddof 1, the half-width
``ci_half`` of the 95% t-interval of the mean, and the seed values) plus
``family_layers.png``, ``family_denominators.png``, ``family_interventions.png``
and ``family_fingerprint.png`` (bands and error bars: the t-intervals). Groups differ in depth, so per-layer arrays are
kept per group (never averaged across depths).
"""

import warnings
from collections.abc import Sequence

import numpy as np

from abspos_jax import storage
from abspos_jax.analysis.estimators import intervals
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.outputs import schema

LAYER_KEYS = {
    "causal_mask": schema.CAUSAL_MASK_LAYER,
    "residual_stream": schema.RESIDUAL_STREAM_LAYER,
    "causal_mask_early": schema.CAUSAL_MASK_LAYER_EARLY,
    "residual_stream_early": schema.RESIDUAL_STREAM_LAYER_EARLY,
    "sink_rate": schema.SINK_RATE,
    "pos0_norm_ratio": schema.POS0_NORM_RATIO,
    "fingerprint_bos": schema.FINGERPRINT_BOS,
    "fingerprint_no_bos": schema.FINGERPRINT_NO_BOS,
    "log_z_slope": (*schema.DENOMINATORS, "log_z_slope_layer"),
    "excess": (*schema.DENOMINATORS, "excess_mean_layer"),
    "max_weight": (*schema.DENOMINATORS, "max_weight_mean_layer"),
    "sink_mass": (*schema.DENOMINATORS, "sink_mass_mean_layer"),
}


def _array(x) -> np.ndarray:
  return np.array([np.nan if v is None else v for v in (x if isinstance(x, list) else [x])], float)


def _stat(values: list[np.ndarray]) -> dict:
  """Mean, std (ddof 1) and ``ci_half``, the half-width of the 95% t-interval of the mean
  (``intervals.seed_half_width``), over seeds of equally shaped arrays; NaN-aware."""
  a = np.stack(values)
  with warnings.catch_warnings():  # all-NaN slices (e.g. a layer without early queries) stay NaN quietly
    warnings.simplefilter("ignore", RuntimeWarning)
    mean = np.nanmean(a, 0)
    std = np.nanstd(a, 0, ddof=1) if len(a) > 1 else np.full(a.shape[1:], np.nan)
  half = intervals.seed_half_width(a)
  clean = lambda v: [None if not np.isfinite(x) else float(x) for x in np.atleast_1d(v)]
  return {"mean": clean(mean), "std": clean(std), "ci_half": clean(half), "values": [clean(v) for v in a]}


def summarise(groups: dict[str, list[dict]]) -> dict:
  """``{group: {"layers": {key: stat}, "interventions": {name: {scope: stat}}}}``.

  ``scope``: ``pooled`` and ``early`` (the residual-stream removed fraction),
  ``change`` and ``change_early`` (its change, nats^2).

  ``groups`` maps a group label to its runs' ``summary.json`` dicts.
  """
  out = {}
  for label, summaries in groups.items():
    entry: dict = {"num_runs": len(summaries), "layers": {}, "interventions": {}}
    for key, path in LAYER_KEYS.items():
      vals = [_array(schema.get(s, path)) for s in summaries if schema.get(s, path) is not None]
      if vals and len({v.shape for v in vals}) == 1:
        entry["layers"][key] = _stat(vals)
    for name in schema.INTERVENTION_NAMES:
      path = (*schema.INTERVENTIONS, *name.split("."))
      found = [schema.get(s, path) for s in summaries]
      if all(isinstance(f, dict) for f in found):
        entry["interventions"][name] = {
            scope: _stat([_array(f.get(f"residual_stream_{what}{suffix}")) for f in found])
            for scope, what, suffix in (("pooled", "removed", ""), ("early", "removed", "_early"),
                                        ("change", "change", ""), ("change_early", "change", "_early"))}
    out[label] = entry
  return out


def short_labels(labels: list[str]) -> dict[str, str]:
  """Figure labels: ``compare.group_key`` labels without the ``[...]`` of settings that all groups share."""
  parts = {label: label.split(" [", 1) for label in labels}
  shared = {p[1] for p in parts.values() if len(p) == 2}
  if len(shared) == 1 and all(len(p) == 2 for p in parts.values()):
    return {label: p[0] for label, p in parts.items()}
  return {label: label for label in labels}


def write(groups: dict[str, list[dict]], out: str, mixed: Sequence[str] = ()) -> dict:
  """``family.json`` and the four figures in ``out``; returns the summary. ``mixed``: warnings that the runs
  were trained or analysed by different code (:func:`abspos_jax.provenance.mixed`), printed under every figure."""
  table = summarise(groups)
  storage.write_json(storage.join(out, "family.json"), table, indent=1, sort_keys=False)
  if table:
    short = short_labels(list(table))
    plotted = {short[k]: v for k, v in table.items()}
    _layers_figure(plotted, storage.join(out, "family_layers.png"), mixed=mixed)
    _layers_figure(plotted, storage.join(out, "family_denominators.png"), DENOMINATOR_PANELS, mixed=mixed)
    _interventions_figure(plotted, storage.join(out, "family_interventions.png"), mixed)
    _fingerprint_figure(plotted, storage.join(out, "family_fingerprint.png"), mixed)
  return table


def _save(fig, path: str, mixed: Sequence[str]) -> None:
  """Lay out, note mixed code versions under the panels, save and close."""
  if mixed:
    fig.text(0.5, 0.0, "Warning: " + "; ".join(mixed)[:300] + " (comparison.md)", ha="center", va="bottom",
             color="red", fontsize=7, wrap=True)
  fig.tight_layout(rect=(0, 0.05 if mixed else 0, 1, 1))
  storage.save_figure(fig, path, dpi=100)
  _plt().close(fig)


def _band(ax, x, stat: dict, label: str, **kw) -> None:
  """The mean over seeds and its 95% t-interval as a shaded band (none drawn with one seed)."""
  mean, half = _array(stat["mean"]), _array(stat["ci_half"])
  line, = ax.plot(x, mean, "o-", label=label, ms=3, **kw)
  ax.fill_between(x, mean - half, mean + half, color=line.get_color(), alpha=0.2)


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


LAYER_PANELS = (("residual_stream", "residual-stream share"), ("residual_stream_early", "residual-stream share, early"),
                ("sink_rate", f"sink rate (eps {AnalysisOptions.sink_epsilon})"), ("pos0_norm_ratio", "pos-0 / other norm ratio"))
DENOMINATOR_PANELS = (("log_z_slope", "slope of log Z on log|V(i)|"), ("excess", "excess log Z - log|V(i)| (nats)"),
                      ("max_weight", "max attention weight"), ("sink_mass", "weight on key 0 (queries that see it)"))


def _layers_figure(table: dict, path: str, panels: tuple = LAYER_PANELS, mixed: Sequence[str] = ()) -> None:
  """One panel per ``(key, title)`` that some group has (older summaries lack newer keys); none: no figure."""
  panels = [(key, title) for key, title in panels if any(key in entry["layers"] for entry in table.values())]
  if not panels:
    return
  plt = _plt()
  from matplotlib.ticker import MaxNLocator
  fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.4), squeeze=False)
  axes = axes[0]
  for ax, (key, title) in zip(axes, panels):
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for label, entry in table.items():
      if key in entry["layers"]:
        stat = entry["layers"][key]
        start = 0 if key == "pos0_norm_ratio" else 1  # norm ratios include the embedding (depth 0)
        _band(ax, np.arange(start, start + len(stat["mean"])), stat, label)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("layer" if key != "pos0_norm_ratio" else "depth (0 = embedding)")
    ax.axhline(0, color="k", lw=0.6)
  axes[0].legend(fontsize=6)
  fig.suptitle("Per layer, mean over seeds and its 95% t-interval", fontsize=10)
  _save(fig, path, mixed)


FRACTION_RANGE = (-1.5, 2.5)  # the removed-fraction axis; bars and intervals beyond it are cut at the frame


def _interventions_figure(table: dict, path: str, mixed: Sequence[str] = ()) -> None:
  plt = _plt()
  labels = [k for k in table if table[k]["interventions"]]
  if not labels:
    return
  # Capped at 26 inches (2,600 px): with many runs the bars narrow instead of the figure growing.
  fig, axes = plt.subplots(2, 2, figsize=(min(26, max(8, 1.6 * len(labels) * 2)), 7.0), sharey="row", squeeze=False)
  width = 0.8 / len(schema.INTERVENTION_NAMES)
  x = np.arange(len(labels))
  for row, (what, unit) in enumerate((("", "fraction removed (dashed: the paper's ~0.4)"),
                                      ("change", "change, after - before (nats^2)"))):
    for ax, scope in zip(axes[row], ("early", "pooled")):
      key = scope if not what else ("change_early" if scope == "early" else "change")
      for k, name in enumerate(schema.INTERVENTION_NAMES):
        have = [name in table[g]["interventions"] and key in table[g]["interventions"][name] for g in labels]
        means = [_array(table[g]["interventions"][name][key]["mean"])[0] if h else np.nan
                 for g, h in zip(labels, have)]
        halves = np.array([_array(table[g]["interventions"][name][key]["ci_half"])[0] if h else np.nan
                           for g, h in zip(labels, have)])
        bars = ax.bar(x + (k - len(schema.INTERVENTION_NAMES) / 2 + 0.5) * width, means, width,
                      yerr=np.nan_to_num(halves), capsize=2, label=name)
        for bar, half in zip(bars, halves):
          if not np.isfinite(half):  # a mean of fewer than two seeds: no interval to draw
            bar.set_hatch("////")
            bar.set_alpha(0.5)
      ax.axhline(0, color="k", lw=0.6)
      if not what:
        ax.axhline(0.4, color="gray", lw=0.8, ls="--")
        ax.set_ylim(*FRACTION_RANGE)  # a fraction of a near-zero component can be in the hundreds
      else:
        ax.set_yscale("symlog", linthresh=1e-3)  # changes span nats^2 from 1e-4 (RoPE) to 1 (nope)
      ax.set_xticks(x)
      ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
      ax.set_title(f"residual-stream component {'removed' if not what else 'change'} ({scope} queries)",
                   fontsize=9)
    axes[row, 0].set_ylabel(unit, fontsize=8)
  from matplotlib.patches import Patch  # plain swatches: a hatched first bar would hatch its legend entry too
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  axes[0, 1].legend(handles=[Patch(color=colours[k % len(colours)], label=name)
                             for k, name in enumerate(schema.INTERVENTION_NAMES)], fontsize=6)
  fig.suptitle(f"Interventions, mean over seeds and its 95% t-interval (fractions shown within {FRACTION_RANGE}; "
               "changes on a symmetric log axis;\na removed fraction exists only where the component before "
               "is clearly non-zero; hatched: fewer than two seeds, no interval)", fontsize=9)
  _save(fig, path, mixed)


def _fingerprint_figure(table: dict, path: str, mixed: Sequence[str] = ()) -> None:
  plt = _plt()
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
  for ax, key, title in ((axes[0], "fingerprint_bos", "BOS at position 0"),
                         (axes[1], "fingerprint_no_bos", "text token at position 0")):
    for label, entry in table.items():
      if key in entry["layers"]:
        stat = entry["layers"][key]
        _band(ax, np.arange(len(stat["mean"])), stat, label)
    ax.set_title(f"spread of h_0 across inputs / its norm: {title}", fontsize=9)
    ax.set_xlabel("depth (0 = embedding)")
  axes[0].legend(fontsize=6)
  _save(fig, path, mixed)
