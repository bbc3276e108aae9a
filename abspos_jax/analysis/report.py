"""``report.md``: what was analysed and each result in one sentence, figures inline.

Every headline number is printed with its interval beside it, ``0.12 [0.08,
0.16]`` (summary.json ``KEY_ci``: the 95% delete-one-block jackknife over
sequence blocks; ``[n/a]`` where the summary has none or it is not finite).
"""


def _f(x, digits: int = 3) -> str:
  if x is None:
    return "n/a"
  return f"{x:.{digits}g}" if x != 0 and (abs(x) < 1e-3 or round(x, digits) == 0) else f"{x:.{digits}f}"


def _g(x, digits: int = 3) -> str:
  """Covariances in nats^2: significant digits whatever the magnitude."""
  return "n/a" if x is None else f"{x:.{digits}g}"


def with_interval(x, ci, digits: int = 3, fmt=_f) -> str:
  """``value [lo, hi]``; the bounds as ``n/a`` where missing."""
  if ci is None or len(ci) != 2 or ci[0] is None or ci[1] is None:
    return fmt(x, digits) + ("" if x is None else " [n/a]")
  return f"{fmt(x, digits)} [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def _layers(values, digits: int = 2) -> str:
  return ", ".join(_f(v, digits) for v in values)


def _layers_ci(values, cis, digits: int = 2) -> str:
  """Per-layer values with their intervals: ``0.12 [0.08, 0.16]; 0.30 [0.25, 0.35]``."""
  cis = cis if cis is not None else [None] * len(values)
  return "; ".join(with_interval(v, c, digits) for v, c in zip(values, cis))


def _interventions(iv: dict) -> list[str]:
  lines = ["", "## Interventions", "",
           "Change of each pooled component of the query-position effect on log a (after - before covariance, "
           "nats^2; negative: smaller after), then the fraction removed (1 - after / before), both with 95% "
           "intervals. The fraction is given only where the component before is clearly non-zero. The reference "
           "paper reports about 0.4 of the residual-stream component removed at early queries by BOS replacement.",
           "", "| intervention | causal mask | residual stream | causal mask (early) | residual stream (early) |",
           "|---|---|---|---|---|"]
  rows = [(f"bos_replace[{k}]", v) for k, v in iv.get("bos_replace", {}).items() if isinstance(v, dict)]
  rows += [(k, iv[k]) for k in ("pos0_patch", "sink_ablate") if isinstance(iv.get(k), dict)]
  reasons = []
  for name, r in rows:
    cells = []
    for suffix in ("", "_early"):
      for comp in ("causal_mask", "residual_stream"):
        change = with_interval(r.get(f"{comp}_change{suffix}"), r.get(f"{comp}_change{suffix}_ci"), fmt=_g)
        removed = r.get(f"{comp}_removed{suffix}")
        if removed is None:
          frac = "n/a"
          reason = r.get(f"{comp}_removed{suffix}_reason")
          if reason and reason not in reasons:
            reasons.append(reason)
        else:
          frac = with_interval(removed, r.get(f"{comp}_removed{suffix}_ci"))
        cells.append(f"{change}; removed {frac}")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines.append("")
  for reason in reasons:
    lines.append(f"Removed fraction n/a: {reason}.")
  skipped = iv.get("bos_replace", {}).get("skipped")
  if skipped:
    lines.append(f"bos_replace skipped: {skipped}.")
  if "token_id" in iv.get("bos_replace", {}):
    lines.append(f"bos_replace[token] puts token {iv['bos_replace']['token_id']} at position 0.")
  if "source" in iv.get("pos0_patch", {}):
    lines.append(f"pos0_patch source: {iv['pos0_patch']['source']}.")
  if "sink_ablate" in iv:
    lines.append(f"sink_ablate heads: {iv['sink_ablate']['heads_rule']}: {iv['sink_ablate']['heads']}.")
  return lines


def _fingerprint_sinks_probes(s: dict, eps: float, min_query: int) -> list[str]:
  """The report's fingerprint, sinks and probes paragraphs."""
  fp, lines = s["fingerprint"], []
  if "bos" in fp:
    lines.append(f"- **Fingerprint.** With the auto-prepended BOS the spread of h_0 across inputs is at most "
                 f"{_f(max(fp['bos']))} of its norm (0 expected)"
                 + (f"; without BOS it is {_layers(fp['no_bos'])} ({fp['no_bos_num_groups']} distinct x_0)."
                    if "no_bos" in fp else "."))
  lines.append(f"- **Sinks.** Heads are chosen on half the sequences (even blocks: mean weight a_i0 on key 0 over "
               f"the queries i >= {min_query} that see key 0 above epsilon {eps}) and their scores measured on the "
               f"other half (odd blocks). The held-out score of the top-chosen head is "
               f"{with_interval(s['sink_score_max'], s.get('sink_score_max_ci'))} (per layer: "
               f"{_layers_ci(s.get('sink_score_max_layer', []), s.get('sink_score_max_layer_ci'))}); "
               f"sink rate at epsilon {eps} per layer: {_layers(s['sink_rate'])}"
               + (f"; sink-reading heads (layer, head): {s['sink_heads']}." if s["sink_heads"] else
                  "; no head reads the sink."))
  pr = s["probes"]
  lines.append(f"- **Probes.** A ridge probe reads log(1+i) from the residual stream with held-out R^2 "
               f"{_layers_ci(pr['residual_r2'], pr.get('residual_r2_ci'))} per layer (embedding first), and from "
               f"the residual part of log Z (the mask's log|V(i)| removed) with "
               f"{_layers_ci(pr['attention_r2'], pr.get('attention_r2_ci'))}."
               + (f" The raw attention features (log Z, entropy, sink mass, max weight) give "
                  f"{_layers_ci(pr['attention_raw_r2'], pr.get('attention_raw_r2_ci'))}, but these measure the "
                  f"mask (log Z = log(1+i) under flat attention), not position information in the stream."
                  if "attention_raw_r2" in pr else ""))
  return lines


def _denominators(d: dict) -> str:
  per_layer = lambda key: _layers_ci(d[key], d.get(key + "_ci"))  # noqa: E731
  return (f"- **Denominators.** The slope of mean log Z_i against log|V(i)| is {per_layer('log_z_slope_layer')} "
          f"per layer (1 = flat logits, the pure causal-mask effect; near 0 when a sink holds the mass); the mean "
          f"excess E_i = log Z_i - log|V(i)| is {per_layer('excess_mean_layer')} nats; the mean weight on key 0 "
          f"(queries i >= 1 that see it) is {per_layer('sink_mass_mean_layer')}.")


def render(summary: dict, meta: dict, figures: list[str]) -> str:
  s, c = summary, summary["components"]
  L = s["num_layers"]
  opts = meta.get("options", {})
  eps, min_query = opts.get("sink_epsilon", 0.3), opts.get("sink_min_query", 4)
  lk, pooled, early = s["leakage"], c["pooled"], c["pooled_early"]
  iv_info = s.get("intervals", {})
  lines = [
      f"# Analysis of `{meta.get('workdir', 'model')}`", "",
      f"- checkpoint step: {meta.get('step', 'n/a')}; architecture: `{s['position']}`, {L} layers x "
      f"{s['num_heads']} heads",
      f"- data: `{meta.get('data', 'n/a')}` ({meta.get('split', 'n/a')} split), {s['num_sequences']} sequences of "
      f"{s['seq_len']} tokens per BOS policy; headline numbers use `bos={s['main_policy']}`",
      "- held-out loss: " + ", ".join(f"{k}: {v:.3f} nats/token" for k, v in s["loss"].items()),
      f"- intervals `value [lo, hi]`: {iv_info.get('level', 0.95):.0%} {iv_info.get('method', 'jackknife')}; "
      f"{iv_info.get('nonempty_blocks', 'n/a')} of {iv_info.get('num_blocks', 'n/a')} blocks hold sequences", "",
      "## Results", "",
      _denominators(s["denominators"]),
      f"- **Leakage.** Held-out absolute-position R^2 gain (offset + query effects over offset alone) is "
      f"{with_interval(lk['log_weights_overall'], lk.get('log_weights_overall_ci'))} for log-weights and "
      f"{with_interval(lk['logits_overall'], lk.get('logits_overall_ci'))} for logits "
      f"(per layer, log-weights: {_layers_ci(lk['log_weights_layer'], lk.get('log_weights_layer_ci'))}).",
      f"- **Components.** Of the query-position effect on log a, the causal mask accounts for "
      f"{with_interval(pooled['causal_mask'], pooled.get('causal_mask_ci'))} and the residual stream for "
      f"{with_interval(pooled['residual_stream'], pooled.get('residual_stream_ci'))} pooled over layers (residual-stream "
      f"component {with_interval(pooled.get('residual_stream_var'), pooled.get('residual_stream_var_ci'), fmt=_g)} nats^2; "
      f"per layer: mask {_layers_ci(c['causal_mask'], c.get('causal_mask_ci'))}; residual "
      f"{_layers_ci(c['residual_stream'], c.get('residual_stream_ci'))}); at early queries the residual-stream share "
      f"is {with_interval(early['residual_stream'], early.get('residual_stream_ci'))}.",
      f"- **Position 0.** Its residual norm is {_layers(s['position0']['norm_ratio'])} times that of other positions "
      f"across depth (embedding output first); closedness check: max |h_0 change| when later tokens change = "
      f"{_f(s['closedness_max_abs_diff'])} (0 expected).",
  ]
  lines += _fingerprint_sinks_probes(s, eps, min_query)
  iv = s.get("interventions")
  if iv:
    lines += _interventions(iv)
  lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
  lines += ["", "Definitions of every number: `docs/estimators.md` and `docs/analysis.md`.", ""]
  return "\n".join(lines)
