"""``report.md``: what was analysed and each result in one sentence, per-layer tables, figures inline.

Every headline number is printed with its interval beside it, ``0.12 [0.08,
0.16]`` (summary.json ``KEY_ci``: the 95% delete-one-block jackknife over
sequence blocks; ``[n/a]`` where the summary has none or it is not finite).
"""

from abspos_jax import provenance
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.outputs import schema


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


def _interventions(iv: dict) -> list[str]:
  lines = ["", "## Interventions", "",
           "Change of each pooled component of the query-position effect on log a (after - before covariance, "
           "nats^2; negative: smaller after), then the fraction removed (1 - after / before), both with 95% "
           "intervals. The fraction is given only where the component before is clearly non-zero. The reference "
           "paper reports about 0.4 of the residual-stream component removed at early queries by BOS replacement.",
           "", "| intervention | causal mask | residual stream | causal mask (early) | residual stream (early) |",
           "|---|---|---|---|---|"]
  rows = schema.intervention_rows(iv)
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
    lines.append(f"sink_ablate removes key 0 from {len(iv['sink_ablate']['heads'])} heads "
                 f"({iv['sink_ablate']['heads_rule']}; the list: summary.json `interventions.sink_ablate.heads`).")
  return lines


def _cell(d: dict, key: str, i: int, digits: int = 2) -> str:
  """Entry ``i`` of the per-layer list ``d[key]`` with its interval (``d[key + "_ci"]``); ``n/a`` if absent."""
  values = d.get(key)
  if values is None or i >= len(values):
    return "n/a"
  cis = d.get(key + "_ci")
  return with_interval(values[i], cis[i] if cis is not None and i < len(cis) else None, digits)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
  return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
          + ["| " + " | ".join(r) + " |" for r in rows])


def _layer_tables(s: dict, early_max: int) -> list[str]:
  """The per-layer quantities, one row per layer: denominators and sinks, then leakage and probes, then the
  residual stream by depth (embedding output first)."""
  d, c, lk, pr, p0, fp = (schema.get(s, path) for path in (schema.DENOMINATORS, schema.COMPONENTS, schema.LEAKAGE,
                                                            schema.PROBES, schema.POSITION0, schema.FINGERPRINT))
  num_layers, num_heads = schema.get(s, schema.NUM_LAYERS), schema.get(s, schema.NUM_HEADS)
  heads = [sum(1 for l, _ in schema.get(s, schema.SINK_HEADS) if l == layer) for layer in range(num_layers)]
  sinks = {"sink_score_max_layer": schema.get(s, schema.SINK_SCORE_MAX_LAYER),
           "sink_score_max_layer_ci": schema.interval(s, schema.SINK_SCORE_MAX_LAYER)}
  lines = ["", "### Denominators and sinks", "",
           "Slope of mean log Z_i on log|V(i)| (1: flat logits, the pure mask effect; near 0: a sink holds the "
           "mass), mean excess E_i = log Z_i - log|V(i)| (nats), mean weight on key 0 (queries i >= 1), share of "
           "heads that read the sink, how many heads were chosen as sink-reading (the list: summary.json "
           "`sink_heads`), and the held-out score of the layer's best head.", ""]
  lines += _table(["layer", "slope of log Z", "excess (nats)", "weight on key 0", "sink rate", "sink heads",
                   "best sink score"],
                  [[str(l), _cell(d, "log_z_slope_layer", l), _cell(d, "excess_mean_layer", l),
                    _cell(d, "sink_mass_mean_layer", l), _f(schema.get(s, schema.SINK_RATE)[l], 2),
                    f"{heads[l]}/{num_heads}",
                    _cell(sinks, "sink_score_max_layer", l)] for l in range(num_layers)])
  lines += ["", "### Leakage and its components", "",
            "Held-out absolute-position R^2 gain of log a, the causal-mask and residual-stream shares of its "
            f"query-position effect (all queries, and early queries 1 <= i < {early_max}), and the attention-feature "
            "probe (the residual part of log Z).", ""]
  lines += _table(["layer", "leakage (log a)", "causal mask", "residual stream", "causal mask (early)",
                   "residual stream (early)", "probe R^2 (log Z)"],
                  [[str(l), _cell(lk, "log_weights_layer", l, 3), _cell(c, "causal_mask", l),
                    _cell(c, "residual_stream", l), _cell(c, "causal_mask_early", l),
                    _cell(c, "residual_stream_early", l), _cell(pr, "attention_r2", l)] for l in range(num_layers)])
  lines += ["", "### The residual stream by depth", "",
            "Position 0's norm over the mean norm of the other positions, its cosine to the previous depth, its "
            "spread across inputs relative to its norm (with BOS: 0 expected; without, x_0 varies), and the "
            "residual probe's held-out R^2 of log(1+i).", ""]
  depth = ["embedding"] + [f"after layer {l}" for l in range(num_layers)]
  cos_prev = [None] + list(p0.get("cos_prev", []))
  lines += _table(["depth", "pos-0 norm ratio", "cos to previous", "fingerprint (BOS)", "fingerprint (no BOS)",
                   "probe R^2 (residual)"],
                  [[name, _f(p0["norm_ratio"][i], 2), _f(cos_prev[i], 3) if i < len(cos_prev) else "n/a",
                    _f(fp["bos"][i]) if "bos" in fp else "n/a", _f(fp["no_bos"][i]) if "no_bos" in fp else "n/a",
                    _cell(pr, "residual_r2", i)] for i, name in enumerate(depth)])
  return lines


def _headlines(s: dict, eps: float, min_query: int) -> list[str]:
  """The pooled numbers, one sentence each."""
  lk, pooled, early = schema.get(s, schema.LEAKAGE), schema.get(s, schema.POOLED), schema.get(s, schema.POOLED_EARLY)
  heads = schema.get(s, schema.SINK_HEADS)
  layers_with = sorted({l for l, _ in heads})
  lines = [
      f"- **Leakage.** Held-out absolute-position R^2 gain (offset + query effects over offset alone): "
      f"{with_interval(lk['log_weights_overall'], lk.get('log_weights_overall_ci'))} for log-weights, "
      f"{with_interval(lk['logits_overall'], lk.get('logits_overall_ci'))} for logits.",
      f"- **Components.** Of the query-position effect on log a, the causal mask accounts for "
      f"{with_interval(pooled['causal_mask'], pooled.get('causal_mask_ci'))} and the residual stream for "
      f"{with_interval(pooled['residual_stream'], pooled.get('residual_stream_ci'))} pooled over layers "
      f"(residual-stream component "
      f"{with_interval(pooled.get('residual_stream_var'), pooled.get('residual_stream_var_ci'), fmt=_g)} nats^2); "
      f"at early queries the residual-stream share is "
      f"{with_interval(early['residual_stream'], early.get('residual_stream_ci'))}.",
      f"- **Sinks.** {len(heads)} of {schema.get(s, schema.NUM_LAYERS) * schema.get(s, schema.NUM_HEADS)} heads "
      "read the sink (chosen on the even "
      f"sequence blocks: mean a_i0 over the queries i >= {min_query} that see key 0 above {eps}; "
      + (f"in layers {_ranges(layers_with)}" if layers_with else "none") + "); the best held-out score is "
      f"{with_interval(schema.get(s, schema.SINK_SCORE_MAX), schema.interval(s, schema.SINK_SCORE_MAX))} "
      "(odd blocks).",
      f"- **Position 0.** Its norm is up to {_f(max(_finite(schema.get(s, schema.POS0_NORM_RATIO))), 3)} times "
      f"that of other positions; closedness check: max |h_0 change| when later tokens change = "
      f"{_f(schema.get(s, schema.CLOSEDNESS))} (0 expected).",
  ]
  fp = schema.get(s, schema.FINGERPRINT)
  if "bos" in fp:
    without = (f"; without BOS up to {_f(max(_finite(fp['no_bos'])))} ({fp['no_bos_num_groups']} distinct x_0)."
               if "no_bos" in fp else ".")
    lines.append(f"- **Fingerprint.** With BOS the spread of h_0 across inputs is at most "
                 f"{_f(max(_finite(fp['bos'])))} of its norm (0 expected){without}")
  return lines


def _finite(values) -> list[float]:
  return [v for v in values if v is not None and v == v] or [float("nan")]


def _ranges(layers: list[int]) -> str:
  """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
  out, start = [], None
  for i, l in enumerate(layers):
    if start is None:
      start = l
    if i + 1 == len(layers) or layers[i + 1] != l + 1:
      out.append(str(start) if start == l else f"{start}-{l}")
      start = None
  return ", ".join(out)


def _source_lines(meta: dict) -> list[str]:
  """What was analysed, for imported checkpoints and variants."""
  lines = []
  ckpt = meta.get("checkpoint")
  if ckpt:
    types = ", ".join(f"{k} x{v}" for k, v in ckpt.get("tensor_types", {}).items())
    kind = ckpt["format"] + (f", {ckpt['file_type']} ({types} tensors, dequantised to float32)"
                             if ckpt.get("file_type") else "")
    lines.append(f"- checkpoint: {kind}")
  tok = meta.get("tokenizer")
  if tok:
    lines.append(f"- position 0: BOS {tok.get('bos_token')!r} (id {tok.get('bos_id')}), documents separated by "
                 f"{tok.get('eos_token')!r} (id {tok.get('eos_id')}); main policy `{tok.get('main_policy')}` "
                 f"({tok.get('from')})")
  variant = meta.get("variant")
  if variant:
    what = variant.get("rope_scale") or f"window of {variant['window']} keys"
    lines.append(f"- **variant** {what}: an {variant['kind']}; held-out loss of the unmodified model on the main "
                 f"policy's sequences: {variant['loss_unmodified']:.3f} nats/token")
  return lines


def render(summary: dict, meta: dict, figures: list[str]) -> str:
  s = summary
  L = schema.get(s, schema.NUM_LAYERS)
  o = AnalysisOptions.from_dict(meta.get("options", {}))
  eps, min_query = o.sink_epsilon, o.sink_min_query
  iv_info = schema.get(s, schema.INTERVALS, {})
  texts = meta.get("texts") or {}
  lines = [
      f"# Analysis of `{meta.get('workdir', 'model')}`", "",
      f"- checkpoint step: {meta.get('step', 'n/a')}; architecture: `{schema.get(s, schema.POSITION)}`, {L} layers x "
      f"{schema.get(s, schema.NUM_HEADS)} heads",
      f"- data: `{meta.get('data', 'n/a')}` ({meta.get('split', 'n/a')} split"
      + (f", files {texts['files']}" if texts.get("files") else "")
      + f"), {schema.get(s, schema.NUM_SEQUENCES)} sequences of {schema.get(s, schema.SEQ_LEN)} tokens per BOS "
      f"policy; headline numbers use `bos={schema.get(s, schema.MAIN_POLICY)}`",
      *_source_lines(meta),
      "- held-out loss: " + ", ".join(f"{k}: {v:.3f} nats/token" for k, v in schema.get(s, schema.LOSS).items()),
      f"- intervals `value [lo, hi]`: {iv_info.get('level', 0.95):.0%} {iv_info.get('method', 'jackknife')}; "
      f"{iv_info.get('nonempty_blocks', 'n/a')} of {iv_info.get('num_blocks', 'n/a')} blocks hold sequences",
      f"- provenance: {provenance.describe(meta.get('provenance'))}", "",
      "## Results", "",
      *_headlines(s, eps, min_query),
      "", "## Per layer",
      *_layer_tables(s, o.early_max),
  ]
  iv = schema.get(s, schema.INTERVENTIONS)
  if iv:
    lines += _interventions(iv)
  lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in figures]
  lines += ["", "Definitions of every number: `docs/estimators.md` and `docs/analysis.md`.", ""]
  return "\n".join(lines)
