"""Leakage against context length: one checkpoint analysed at several sequence lengths (``analyze.py --seq_lens``).

:func:`parse_seq_lens` reads ``--seq_lens`` (``T`` or ``T:N``: N sequences at
T tokens); :func:`kept` says whether a length's earlier analysis can be kept
on a rerun; :func:`length_record` condenses the analysis at one length (its
``summary.json``) into the numbers that ``lengths.json`` tracks, with their
intervals; :func:`write_lengths` writes ``lengths.json``, ``lengths.png`` (each
component against the context length, with error bars) and ``report.md`` (the
same numbers as a table) for every analysed length.
"""

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from abspos_jax import provenance, storage  # noqa: E402
from abspos_jax.analysis.outputs import schema  # noqa: E402
from abspos_jax.analysis.outputs.curves import plot_ci, plot_record_panels, summary_record  # noqa: E402
from abspos_jax.analysis.outputs.report import with_interval  # noqa: E402

SLOPE = (*schema.DENOMINATORS, "log_z_slope_layer")


def parse_seq_lens(texts: Sequence[str]) -> list[tuple[int, int | None]]:
  """``["128", "8192:8"]`` -> ``[(128, None), (8192, 8)]``, checked by :func:`check_seq_lens`."""
  pairs = []
  for text in texts:
    t, _, n = text.strip().partition(":")
    if not t.isdigit() or not (n.isdigit() or not n):
      raise ValueError(f"--seq_lens takes token counts T or T:N (N sequences at T tokens), e.g. "
                       f"128,512,8192:8; got {text!r}")
    pairs.append((int(t), int(n) if n else None))
  return check_seq_lens(pairs)


def check_seq_lens(pairs: Sequence[tuple[int, int | None]]) -> list[tuple[int, int | None]]:
  """The ``(T, N)`` pairs sorted by T, repeats dropped; T >= 2 and N >= 2 (or None), one N per T, else a
  ValueError naming ``--seq_lens``."""
  by_len: dict[int, int | None] = {}
  for t, n in pairs:
    if t < 2 or (n is not None and n < 2):
      raise ValueError(f"--seq_lens must be lengths >= 2, each with >= 2 sequences; got {t}:{n}")
    if by_len.get(t, n) != n:
      raise ValueError(f"--seq_lens gives {t} tokens twice, with {by_len[t]} and {n} sequences")
    by_len[t] = n
  if not by_len:
    raise ValueError("--seq_lens must name at least one length")
  return sorted(by_len.items())


def kept(path: str, seq_len: int, num_sequences: int | None) -> dict | None:
  """The ``summary.json`` at ``path`` if it is complete and analysed ``seq_len`` tokens (and ``num_sequences``
  sequences, unless None) with today's estimators and code, else None: what a rerun of the same request keeps."""
  if not storage.path(path).exists():
    return None
  s = storage.read_json(path)
  ok = (s.get("estimators") == schema.ESTIMATORS and s.get("seq_len") == seq_len
        and provenance.analysed_here(s.get("meta", {}))
        and num_sequences in (None, s.get("num_sequences")))
  return s if ok else None


def length_record(seq_len: int, summary: dict) -> dict:
  """``seq_len``, the numbers of ``curves.summary_record``, ``log_z_slope_layer`` (per layer, the mean over heads of
  the slope of ``log Z_i`` on ``log|V(i)|``, with ``log_z_slope_layer_ci``), the main policy's ``loss`` and the
  ``batch_size`` and ``query_block`` the analysis ran with."""
  main = schema.get(summary, schema.MAIN_POLICY)
  return {"seq_len": int(seq_len), **summary_record(summary),
          "log_z_slope_layer": schema.get(summary, SLOPE), "log_z_slope_layer_ci": schema.interval(summary, SLOPE),
          "loss": schema.get(summary, (*schema.LOSS, main)), "num_sequences": summary.get("num_sequences"),
          "batch_size": summary.get("batch_size"),
          "query_block": summary.get("memory", {}).get("query_block")}


def _values(x: list) -> np.ndarray:
  return np.array([np.nan if v is None else v for v in x], float)


def _figure(records: list[dict], path: str, source: str) -> None:
  t = np.array([r["seq_len"] for r in records])
  fig, axes = plt.subplots(1, 4, figsize=(17, 3.6))
  plot_record_panels(axes[:3], t, records)
  layers = len(records[0]["log_z_slope_layer"])
  cmap = plt.get_cmap("viridis")
  for l in range(layers):
    per = [{"v": r["log_z_slope_layer"][l], "v_ci": (r["log_z_slope_layer_ci"] or [None] * layers)[l]}
           for r in records]
    plot_ci(axes[3], t, per, "v", "o-", color=cmap(l / max(layers - 1, 1)), lw=0.8,
          label=f"layer {l}" if l in (0, layers - 1) else None)
  axes[3].axhline(1.0, color="k", ls=":", lw=0.8)
  axes[3].set_title("slope of log Z on log|V(i)| per layer\n(1 dotted: flat attention)", fontsize=9)
  axes[3].legend(fontsize=7)
  if layers > 2:  # the colour of every other layer
    bar = fig.colorbar(plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(0, layers - 1)), ax=axes[3], pad=0.02)
    bar.set_label("layer", fontsize=7)
    bar.ax.tick_params(labelsize=7)
  for ax in axes:
    ax.set_xscale("log", base=2)
    ax.set_xticks(t, [str(x) for x in t], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("context length (tokens)")
  fig.suptitle(f"Leakage against context length: {source} (error bars: 95% jackknife intervals)", fontsize=10)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=110)
  plt.close(fig)


def _report(records: list[dict], source: str) -> str:
  ci = lambda r, k, d=3: with_interval(r.get(k), r.get(k + "_ci"), d)  # noqa: E731
  lines = [f"# Leakage against context length: {source}", "",
           "Each row is the full analysis at that length (`seq_len_<T>/report.md`); intervals are 95% "
           "delete-one-block jackknife intervals. Shares are of the query-position leakage of log a (causal mask "
           "+ residual stream = 1); early queries are 1 <= i < early_max.", "",
           "![components against context length](lengths.png)", "",
           "| tokens | sequences | causal-mask share | residual-stream share | early: causal mask | "
           "early: residual stream | "
           "leakage share | largest sink score | sink rate (max layer) | slope of log Z (mean over layers; per "
           "layer with intervals in the figure) | loss (main policy) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in records:
    slope = _values(r["log_z_slope_layer"])
    loss = "" if r["loss"] is None else f"{r['loss']:.3f}"
    lines.append(f"| {r['seq_len']} | {r.get('num_sequences')} | {ci(r, 'causal_mask_share')} | "
                 f"{ci(r, 'residual_stream_share')} | "
                 f"{ci(r, 'causal_mask_share_early')} | {ci(r, 'residual_stream_share_early')} | "
                 f"{ci(r, 'leakage_share')} | {ci(r, 'sink_score_max')} | "
                 f"{np.nanmax(_values(r['sink_rate'])):.2f} | {np.nanmean(slope):.3f} | {loss} |")
  return "\n".join(lines) + "\n"


def write_lengths(out: str, records: list[dict], source: str) -> None:
  """``lengths.json`` (``{"source", "lengths": [length_record, ...]}``, by length), ``lengths.png`` and
  ``report.md`` into ``out``."""
  records = sorted(records, key=lambda r: r["seq_len"])
  storage.makedirs(out)
  storage.write_json(storage.join(out, "lengths.json"), {"source": source, "lengths": records}, indent=1,
                     sort_keys=False)
  _figure(records, storage.join(out, "lengths.png"), source)
  storage.write_text(storage.join(out, "report.md"), _report(records, source))
