"""Figures of one analysis (PNG, matplotlib's Agg backend: no display needed)."""

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from abspos_jax.analysis.options import AnalysisOptions  # noqa: E402
from abspos_jax.analysis.outputs import schema  # noqa: E402


def _save(fig, out_dir: str, name: str) -> str:
  path = os.path.join(out_dir, name)  # out_dir is local: the temporary directory of writer.write
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return name


def _values(x) -> np.ndarray:
  return np.array([np.nan if v is None else v for v in x], dtype=float)


def ci_errors(values, ci) -> np.ndarray:
  """``yerr [2, n]`` for ``errorbar``/``bar``: distances from ``values`` to the ``[lo, hi]`` of ``ci``.

  ``ci`` is a list of ``[lo, hi]`` (a summary.json ``*_ci``), or None; missing
  or null bounds give no bar (0).
  """
  values = np.asarray(values, float)
  bounds = np.full((len(values), 2), np.nan)
  for i, b in enumerate(ci if ci is not None else []):
    if b is not None:
      bounds[i] = [np.nan if v is None else v for v in b]
  err = np.stack([values - bounds[:, 0], bounds[:, 1] - values])
  return np.nan_to_num(np.maximum(err, 0.0), nan=0.0)


MAX_COLS = 6  # panels per row of a per-layer grid: 32 layers stay within ~2,000 px of width


def grid(n: int, max_cols: int = MAX_COLS) -> tuple[int, int]:
  """``(rows, cols)`` of a grid of ``n`` panels, at most ``max_cols`` wide."""
  cols = min(n, max_cols)
  return -(-n // cols), cols


def log_z_by_query(stats: dict, out_dir: str) -> str:
  log_z, log_v = stats["log_z"], stats["log_visible"]  # [L, H, T], [T] or [L, T]
  L, H, T = log_z.shape
  rows, cols = grid(L)
  fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.5 * rows + 0.6), sharey=True, squeeze=False)
  q = np.arange(T)
  for l, ax in enumerate(axes.flat):
    if l >= L:
      ax.axis("off")
      continue
    for h in range(H):
      ax.plot(q, log_z[l, h], lw=0.8, alpha=0.6, label=f"head {h}" if l == 0 and H <= 8 else None)
    ax.plot(q, log_v if log_v.ndim == 1 else log_v[l], "k--", lw=1.5,
            label="log|V(i)| (flat logits)" if l == 0 else None)
    ax.set_title(f"layer {l}", fontsize=9)
    if l // cols == rows - 1 or l + cols >= L:
      ax.set_xlabel("query position i")
  for ax in axes[:, 0]:
    ax.set_ylabel("mean log Z_i (nats)")
  axes[0, 0].legend(fontsize=7)
  fig.suptitle(f"Softmax denominators against the mask-only baseline ({H} heads per panel)")
  return _save(fig, out_dir, "log_z.png")


def sink_heatmap(stats: dict, summary: dict, out_dir: str, options: AnalysisOptions = AnalysisOptions()) -> str:
  """Held-out sink scores (``stats["sink_score"]``, odd blocks); the heads chosen on the even blocks boxed."""
  score = stats["sink_score"]
  num_layers, num_heads = score.shape
  cell = 0.55 if num_layers <= 16 else 0.4  # 32 layers x 16 heads: ~1,500 x 1,600 px
  fig, ax = plt.subplots(figsize=(2.2 + 0.7 * num_heads, 1.4 + cell * num_layers))
  im = ax.imshow(np.ma.masked_invalid(score), vmin=0, vmax=1, cmap="viridis", aspect="auto")
  for (l, h), v in np.ndenumerate(score):
    ax.text(h, l, "n/a" if not np.isfinite(v) else f"{v:.2f}", ha="center", va="center",
            color="w" if not np.isfinite(v) or v < 0.6 else "k", fontsize=8 if num_layers <= 16 else 6)
  for l, h in schema.get(summary, schema.SINK_HEADS, []):
    ax.add_patch(plt.Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, ec="r", lw=2))
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(score.shape[1]))
  ax.set_yticks(range(score.shape[0]))
  fig.colorbar(im, ax=ax, label="sink score (held out)")
  ax.set_title(f"Mean a_i0 over queries i >= {options.sink_min_query} that see key 0,\non the odd blocks; boxed: "
               f"chosen on the even (above {options.sink_epsilon})", fontsize=8)
  return _save(fig, out_dir, "sink_mass.png")


def position0(summary: dict, out_dir: str) -> str:
  p0 = schema.get(summary, schema.POSITION0)
  depth = np.arange(len(p0["norm"]))
  fig, axes = plt.subplots(1, 3, figsize=(11, 3.0))
  axes[0].plot(depth, _values(p0["norm"]), "o-")
  axes[0].set_ylabel("||h_0^l||")
  axes[1].plot(depth, _values(p0["norm_ratio"]), "o-")
  axes[1].axhline(1.0, color="k", ls="--", lw=1)
  axes[1].set_ylabel("||h_0^l|| / mean ||h_i^l||, i >= 1")
  axes[2].plot(depth[1:], _values(p0["cos_prev"]), "o-")
  axes[2].set_ylabel("cos(h_0^l, h_0^{l-1})")
  for ax in axes:
    ax.set_xlabel("layer (0 = embedding output)")
  fig.suptitle("Position-0 trajectory across depth")
  return _save(fig, out_dir, "position0.png")


def fingerprint(summary: dict, out_dir: str) -> str:
  fp = schema.get(summary, schema.FINGERPRINT)
  fig, ax = plt.subplots(figsize=(5, 3.2))
  for key, label in (("bos", "with auto-prepended BOS"), ("no_bos", "without BOS (x_0 varies)")):
    if key in fp:
      y = np.maximum(_values(fp[key]), 1e-12)
      ax.semilogy(np.arange(len(y)), y, "o-", label=label)
  ax.set_xlabel("layer (0 = embedding output)")
  ax.set_ylabel("spread of h_0^l / mean norm")
  ax.set_title("Position-0 fingerprint across inputs")
  ax.legend(fontsize=8)
  return _save(fig, out_dir, "fingerprint.png")


def components(summary: dict, out_dir: str, options: AnalysisOptions = AnalysisOptions()) -> str:
  c = schema.get(summary, schema.COMPONENTS)
  num_layers = len(c["causal_mask"])
  # Side by side up to 12 layers; deeper models stack the two panels, each ~0.35 inch per layer.
  deep = num_layers > 12
  fig, axes = plt.subplots(2 if deep else 1, 1 if deep else 2, sharey=True, squeeze=False,
                           figsize=(max(10, 0.35 * num_layers), 6.4) if deep else (10, 3.2))
  axes = axes.flat
  for ax, suffix, title in ((axes[0], "", "all queries"),
                            (axes[1], "_early", f"early queries (1 <= i < {options.early_max})")):
    mask, res = _values(c["causal_mask" + suffix]), _values(c["residual_stream" + suffix])
    x = np.arange(len(mask))
    ax.bar(x - 0.2, mask, 0.4, yerr=ci_errors(mask, c.get(f"causal_mask{suffix}_ci")), capsize=3,
           label="causal mask")
    ax.bar(x + 0.2, res, 0.4, yerr=ci_errors(res, c.get(f"residual_stream{suffix}_ci")), capsize=3,
           label="residual stream")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.tick_params(axis="x", labelsize=7 if deep else 10)
    ax.set_xlabel("layer")
    ax.set_title(title)
    ax.set_ylabel("share of query-position\nleakage of log a")
  axes[0].legend(fontsize=8)
  fig.suptitle("Leakage components per layer (error bars: 95% jackknife intervals)", fontsize=10)
  return _save(fig, out_dir, "components.png")


def interventions(summary: dict, out_dir: str) -> str | None:
  """The change (after - before, nats^2) of each pooled component per intervention, with its interval."""
  iv = schema.get(summary, schema.INTERVENTIONS)
  if not iv:
    return None
  rows = schema.intervention_rows(iv)
  if not rows:
    return None
  fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
  for ax, suffix, title in ((axes[0], "", "all queries"), (axes[1], "_early", "early queries")):
    x = np.arange(len(rows))
    for off, comp in ((-0.2, "causal_mask"), (0.2, "residual_stream")):
      vals = _values([r.get(f"{comp}_change{suffix}") for _, r in rows])
      ax.bar(x + off, vals, 0.4, yerr=ci_errors(vals, [r.get(f"{comp}_change{suffix}_ci") for _, r in rows]),
             capsize=3, label=comp.replace("_", " "))
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([name for name, _ in rows], rotation=30, ha="right", fontsize=8)
    ax.set_title(title)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
  axes[0].set_ylabel("change of the component's covariance\n(after - before, nats^2)")
  axes[0].legend(fontsize=8)
  fig.suptitle("Interventions: change of each leakage component (error bars: 95% jackknife intervals)", fontsize=10)
  return _save(fig, out_dir, "interventions.png")


def all_figures(summary: dict, stats: dict, out_dir: str, options: AnalysisOptions = AnalysisOptions()
                ) -> list[str]:
  """Write every figure into ``out_dir`` (titles state the ``options`` the analysis ran with); returns the file
  names."""
  names = [log_z_by_query(stats, out_dir), sink_heatmap(stats, summary, out_dir, options),
           position0(summary, out_dir), fingerprint(summary, out_dir), components(summary, out_dir, options),
           interventions(summary, out_dir)]
  return [n for n in names if n]
