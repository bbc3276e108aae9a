"""``report.md``: what was analysed and each result in one sentence, figures inline."""


def _f(x, digits: int = 3) -> str:
  if x is None:
    return "n/a"
  return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"


def _layers(values, digits: int = 2) -> str:
  return ", ".join(_f(v, digits) for v in values)


def render(summary: dict, meta: dict, figures: list[str]) -> str:
  s, c, fp = summary, summary["components"], summary["fingerprint"]
  L = s["num_layers"]
  lines = [
      f"# Analysis of `{meta.get('workdir', 'model')}`", "",
      f"- checkpoint step: {meta.get('step', 'n/a')}; architecture: `{s['position']}`, {L} layers x "
      f"{s['num_heads']} heads",
      f"- data: `{meta.get('data', 'n/a')}` ({meta.get('split', 'n/a')} split), {s['num_sequences']} sequences of "
      f"{s['seq_len']} tokens per BOS policy; headline numbers use `bos={s['main_policy']}`",
      f"- held-out loss: " + ", ".join(f"{k}: {v:.3f} nats/token" for k, v in s["loss"].items()), "",
      "## Results", "",
      f"- **Denominators.** The slope of mean log Z_i against log|V(i)| is {_layers(s['denominators']['log_z_slope_layer'])} "
      f"per layer (1 = flat logits, the pure causal-mask effect); the mean excess E_i = log Z_i - log|V(i)| is "
      f"{_layers(s['denominators']['excess_mean_layer'])} nats.",
      f"- **Leakage.** Held-out absolute-position R^2 gain (offset + query effects over offset alone) is "
      f"{_f(s['leakage']['log_weights_overall'])} for log-weights and {_f(s['leakage']['logits_overall'])} for logits "
      f"(per layer, log-weights: {_layers(s['leakage']['log_weights_layer'])}).",
      f"- **Components.** Of the query-position effect on log a, the causal mask accounts for "
      f"{_f(c['pooled']['causal_mask'])} and the residual stream for {_f(c['pooled']['residual_stream'])} pooled over "
      f"layers (per layer: mask {_layers(c['causal_mask'])}; residual {_layers(c['residual_stream'])}); at early "
      f"queries the residual-stream share is {_f(c['pooled_early']['residual_stream'])}.",
      f"- **Position 0.** Its residual norm is {_layers(s['position0']['norm_ratio'])} times that of other positions "
      f"across depth (embedding output first); closedness check: max |h_0 change| when later tokens change = "
      f"{_f(s['closedness_max_abs_diff'])} (0 expected).",
  ]
  if "bos" in fp:
    lines.append(f"- **Fingerprint.** With the auto-prepended BOS the spread of h_0 across inputs is at most "
                 f"{_f(max(fp['bos']))} of its norm (0 expected)"
                 + (f"; without BOS it is {_layers(fp['no_bos'])} ({fp['no_bos_num_groups']} distinct x_0)."
                    if "no_bos" in fp else "."))
  lines.append(f"- **Sinks.** The largest mean weight on key 0 (queries i >= 4) is {_f(s['sink_score_max'])}; "
               f"sink rate at epsilon 0.3 per layer: {_layers(s['sink_rate'])}"
               + (f"; sink-reading heads (layer, head): {s['sink_heads']}." if s["sink_heads"] else
                  "; no head reads the sink."))
  lines.append(f"- **Probes.** A ridge probe reads log(1+i) from the residual stream with held-out R^2 "
               f"{_layers(s['probes']['residual_r2'])} per layer, and from attention features with "
               f"{_layers(s['probes']['attention_r2'])}.")
  iv = s.get("interventions")
  if iv:
    lines += ["", "## Interventions", "",
              "Fraction of each component removed (1 - covariance after / before; the reference paper reports about "
              "0.4 of the residual-stream component removed at early queries by BOS replacement).", "",
              "| intervention | causal mask | residual stream | causal mask (early) | residual stream (early) |",
              "|---|---|---|---|---|"]
    rows = [(f"bos_replace[{k}]", v) for k, v in iv["bos_replace"].items() if isinstance(v, dict)]
    rows += [("pos0_patch", iv["pos0_patch"]), ("sink_ablate", iv["sink_ablate"])]
    for name, r in rows:
      lines.append(f"| {name} | {_f(r['causal_mask_removed'])} | {_f(r['residual_stream_removed'])} | "
                   f"{_f(r['causal_mask_removed_early'])} | {_f(r['residual_stream_removed_early'])} |")
    lines += ["", f"sink_ablate heads: {iv['sink_ablate']['heads_rule']}: {iv['sink_ablate']['heads']}."]
  lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
  lines += ["", "Definitions of every number: `docs/estimators.md` and `docs/analysis.md`.", ""]
  return "\n".join(lines)
