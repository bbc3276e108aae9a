"""The analysis API: ``analyze(model, sequences) -> AnalysisResult``.

Two sweeps over the sequences. The baseline sweep runs
:func:`analysis_pass.make_baseline_step` on each BOS policy's sequences
(``prepend``: position 0 is BOS; ``none``: position 0 is a text token). The
intervention sweep reruns the main policy's sequences with each intervention
and measures the fraction of each leakage component it removes. Everything is
a sum accumulated batch by batch on the device; ``finalize`` turns the sums
into results.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import masks
from abspos_jax.analysis import denominators, fixed_effects, interventions, leakage, position0, probes, sinks
from abspos_jax.analysis.analysis_pass import (Statistic, forward, init_accumulators, make_baseline_step,
                                               make_intervention_step)
from abspos_jax.analysis.fixed_effects import FEDesign
from abspos_jax.model import Decoder, ModelSpec

POLICIES = ("prepend", "none")


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
  batch_size: int = 32
  early_max: int = 16  # early queries: 1 <= i < early_max
  sink_epsilon: float = 0.3  # Gu et al. (2024)
  sink_min_query: int = 4
  probe_ridge: float = 1e-2
  interventions: bool = True
  bos_replace_token: int = 10  # the "another token" of bos_replace: newline
  closedness_sequences: int = 4  # per batch, how many sequences the closedness check reruns
  progress: bool = True


@dataclasses.dataclass
class AnalysisResult:
  """``summary``: JSON-ready scalars and per-layer lists; ``stats``: named arrays; ``user``: user statistics."""

  summary: dict
  stats: dict[str, np.ndarray]
  user: dict[str, dict[str, np.ndarray]]


def layer_visible(spec: ModelSpec, seq_len: int) -> jax.Array:
  """``[T, T]`` when every layer has the same mask, else ``[L, T, T]``."""
  windows = spec.layer_windows()
  if len(set(windows)) == 1:
    return masks.causal_mask(seq_len, windows[0])
  return jnp.stack([masks.causal_mask(seq_len, w) for w in windows])


def _bar(total: int, desc: str, enabled: bool):
  from tqdm import tqdm
  return tqdm(total=total, desc=desc, unit="seq", disable=not enabled, leave=False, dynamic_ncols=True)


def _sweep(step, acc, tokens: np.ndarray, options: AnalysisOptions, desc: str, *extra):
  """Fold every batch of ``tokens`` (and of the arrays in ``extra``, batched alike) into ``acc``.

  ``step`` donates ``acc``; the initial leaves are copied first because init
  functions may hand one zeros array to several leaves, and a buffer cannot be
  donated twice.
  """
  acc = jax.tree.map(jnp.copy, acc)
  with _bar(len(tokens), desc, options.progress) as bar:
    for start in range(0, len(tokens), options.batch_size):
      stop = min(start + options.batch_size, len(tokens))
      args = [jnp.asarray(x[start:stop]) for x in extra]
      acc = step(acc, jnp.asarray(tokens[start:stop]), jnp.arange(start, stop), *args)
      bar.update(stop - start)
  return acc


def fingerprint_groups(sequences: Mapping[str, np.ndarray], vocab_size: int) -> tuple[int, np.ndarray]:
  """One fingerprint group per first token that occurs: ``(num_groups, x0_groups int [vocab_size])``."""
  first_tokens = np.unique(np.concatenate([np.asarray(t)[:, 0] for t in sequences.values()]))
  x0_groups = np.zeros(vocab_size, np.int32)
  x0_groups[first_tokens] = np.arange(len(first_tokens))
  return len(first_tokens), x0_groups


def finalize_core(acc: dict, visible: jax.Array, design: FEDesign,
                  options: AnalysisOptions = AnalysisOptions()) -> dict[str, dict[str, jax.Array]]:
  """Results of the core accumulators (``analysis_pass.init_core``); jittable.

  Returns ``denominators`` (``denominators.finalize``), ``leakage``
  (``leakage.finalize`` with ``options.early_max``), ``position0``
  (``position0.finalize``) and ``sinks`` (``sinks.sink_statistics`` of the mean
  sink mass with ``options.sink_min_query`` and ``options.sink_epsilon``).
  """
  den = denominators.finalize(acc["denominators"], visible)
  return {"denominators": den,
          "leakage": leakage.finalize(acc["leakage"], design, early_max=options.early_max),
          "position0": position0.finalize(acc["position0"]),
          "sinks": sinks.sink_statistics(den["sink_mass"], min_query=options.sink_min_query,
                                         epsilon=options.sink_epsilon)}


def _tolist(x) -> Any:
  """JSON-ready: arrays to nested lists, NaN/inf to None."""
  a = np.asarray(x, dtype=np.float64)
  if a.ndim == 0:
    return float(a) if np.isfinite(a) else None
  return [_tolist(v) for v in a]


def _components(fin: dict) -> dict:
  """``components`` of summary.json from ``leakage.finalize``."""
  out = {}
  for prefix, suffix in (("", ""), ("early_", "_early")):
    out["causal_mask" + suffix] = _tolist(fin[prefix + "share_mask_layer"])
    out["residual_stream" + suffix] = _tolist(fin[prefix + "share_res_layer"])
    out["pooled" + suffix] = {"causal_mask": _tolist(fin[prefix + "share_mask_overall"]),
                              "residual_stream": _tolist(fin[prefix + "share_res_overall"]),
                              "leakage_share": _tolist(fin[prefix + "leakage_share_overall"])}
    out["leakage_share" + suffix] = _tolist(fin[prefix + "leakage_share_layer"])
    out["per_head" + suffix] = {"causal_mask": _tolist(fin[prefix + "share_mask"]),
                                "residual_stream": _tolist(fin[prefix + "share_res"])}
  return out


def _removed(before: dict, after: dict) -> dict:
  """Fraction of each component's covariance (nats^2) that an intervention removes."""
  out = {}
  for prefix, suffix in (("", ""), ("early_", "_early")):
    for comp, key in (("causal_mask", "cov_mask"), ("residual_stream", "cov_res")):
      out[f"{comp}_removed{suffix}"] = _tolist(leakage.fraction_removed(before[f"{prefix}{key}_overall"],
                                                                        after[f"{prefix}{key}_overall"]))
      out[f"{comp}_removed{suffix}_per_layer"] = _tolist(leakage.fraction_removed(before[f"{prefix}{key}_layer"],
                                                                                  after[f"{prefix}{key}_layer"]))
  return out


def analyze(model: Decoder, sequences: Mapping[str, np.ndarray], *, main: str = "prepend",
            statistics: Mapping[str, Statistic] | None = None,
            options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Run every estimator of DESIGN section 3 on ``model``.

  Args:
    model: the decoder (any position scheme).
    sequences: ``{"prepend": int [N, T], "none": int [N, T]}``: the exact model
      inputs per BOS policy (the same text under both, see ``data.eval_sequences``).
      ``main`` must be present; the other policy is optional (without it there is
      no no-BOS fingerprint and ``pos0_patch`` takes another input of ``main``).
    main: the policy the headline numbers and the interventions use (the run's
      ``data.bos``).
    statistics: extra :class:`Statistic` s at named hook points.
    options: see :class:`AnalysisOptions`.
  """
  statistics = dict(statistics or {})
  if main not in sequences:
    raise ValueError(f"sequences must hold the main policy {main!r}; got {sorted(sequences)}")
  for name, toks in sequences.items():
    if name not in POLICIES:
      raise ValueError(f"sequences keys must be among {POLICIES}, got {name!r}")
    if toks.ndim != 2 or len(toks) < 2:
      raise ValueError(f"sequences[{name!r}] must be [N >= 2, T], got shape {toks.shape}")
  spec = model.spec
  seq_len = sequences[main].shape[1]
  if spec.position == "learned" and seq_len > spec.max_len:
    raise ValueError(f"sequences of {seq_len} tokens exceed the {spec.max_len} learned positions")
  graphdef, params = nnx.split(model, nnx.Param)
  visible = layer_visible(spec, seq_len)
  design = fixed_effects.make_design(visible)
  L = spec.num_layers

  num_groups, x0_groups = fingerprint_groups(sequences, spec.vocab_size)
  # Donating the accumulators lets XLA update them in place rather than copy them every batch.
  baseline_step = jax.jit(make_baseline_step(graphdef, visible, statistics, jnp.asarray(x0_groups),
                                             options.closedness_sequences), donate_argnums=1)
  finals = {}
  for policy, toks in sequences.items():
    acc = init_accumulators(spec, seq_len, statistics, num_groups=num_groups)
    acc = _sweep(lambda a, t, s: baseline_step(params, a, t, s), acc, toks, options, f"analysis[{policy}]")
    finals[policy] = {
        "acc": acc, **finalize_core(acc, visible, design, options),
        "probe_resid": probes.finalize(acc["probe_resid"], ridge=options.probe_ridge),
        "probe_attn": probes.finalize(acc["probe_attn"], ridge=options.probe_ridge),
    }
  m = finals[main]
  summary: dict = {
      "main_policy": main, "num_sequences": int(len(sequences[main])), "seq_len": int(seq_len),
      "position": spec.position, "num_layers": L, "num_heads": spec.num_heads,
      "loss": {p: float(f["acc"]["loss_sum"] / f["acc"]["loss_count"]) for p, f in finals.items()},
      "closedness_max_abs_diff": float(max(float(jnp.max(f["acc"]["closedness"])) for f in finals.values())),
      "closedness_per_layer": _tolist(m["acc"]["closedness"]),
      "denominators": {
          "log_z_slope_layer": _tolist(jnp.nanmean(m["denominators"]["log_z_slope"], -1)),
          "log_z_slope": _tolist(m["denominators"]["log_z_slope"]),
          "excess_mean_layer": _tolist(m["denominators"]["excess"].mean((-1, -2))),
          "entropy_mean_layer": _tolist(m["denominators"]["entropy"].mean((-1, -2))),
          "max_weight_mean_layer": _tolist(m["denominators"]["max_weight"].mean((-1, -2))),
      },
      "leakage": {
          "logits_layer": _tolist(m["leakage"]["leakage_s_layer"]),
          "log_weights_layer": _tolist(m["leakage"]["leakage_loga_layer"]),
          "logits_overall": _tolist(m["leakage"]["leakage_s_overall"]),
          "log_weights_overall": _tolist(m["leakage"]["leakage_loga_overall"]),
      },
      "components": _components(m["leakage"]),
      "position0": {"norm": _tolist(m["position0"]["pos0_norm"]),
                    "norm_ratio": _tolist(m["position0"]["pos0_norm_ratio"]),
                    "cos_prev": _tolist(m["position0"]["pos0_cos_prev"])},
      "fingerprint": {},
      "sink_rate": _tolist(m["sinks"]["sink_rate"]),
      "sink_score_max": _tolist(m["sinks"]["sink_score_max"]),
      "sink_heads": [[int(l), int(h)] for l, h in zip(*np.nonzero(np.asarray(m["sinks"]["sink_heads"])))],
      "probes": {"residual_r2": _tolist(m["probe_resid"]["r2"]), "attention_r2": _tolist(m["probe_attn"]["r2"])},
  }
  for policy, key in (("prepend", "bos"), ("none", "no_bos")):
    if policy in finals:
      p0 = finals[policy]["position0"]
      summary["fingerprint"][key] = _tolist(p0["fingerprint_spread"])
      summary["fingerprint"][f"{key}_group_cos"] = _tolist(p0["fingerprint_group_cos"])
      summary["fingerprint"][f"{key}_within"] = _tolist(p0["fingerprint_within"])
      summary["fingerprint"][f"{key}_between"] = _tolist(p0["fingerprint_between"])
      summary["fingerprint"][f"{key}_num_groups"] = int(p0["num_groups"])

  stats = {"tokens": np.asarray(sequences[main]), "log_visible": np.asarray(m["denominators"]["log_visible"]),
           "pos0_norm": np.asarray(m["position0"]["pos0_norm"])}
  for name in denominators.QUANTITIES:
    stats[name] = np.asarray(m["denominators"][name])
    stats[name + "_std"] = np.asarray(m["denominators"][name + "_std"])
  for name in ("phi_s", "phi_E", "phi_loga", "phi_logV", "share_mask", "share_res", "early_share_mask",
               "early_share_res", "leakage_s", "leakage_loga"):
    stats[name] = np.asarray(m["leakage"][name])
  for name in ("pos0_norm_ratio", "pos0_cos_prev", "fingerprint_spread"):
    stats[name] = np.asarray(m["position0"][name])
  stats["sink_score"] = np.asarray(m["sinks"]["sink_score"])
  stats["probe_resid_r2"] = np.asarray(m["probe_resid"]["r2"])
  stats["probe_attn_r2"] = np.asarray(m["probe_attn"]["r2"])
  other = [p for p in sequences if p != main]
  if other:
    stats["tokens_" + other[0]] = np.asarray(sequences[other[0]])
    stats["fingerprint_spread_" + other[0]] = np.asarray(finals[other[0]]["position0"]["fingerprint_spread"])

  if options.interventions:
    summary["interventions"] = _interventions(model, graphdef, params, sequences, main, visible, m, options)
  user = {name: jax.device_get(stat.finalize(m["acc"]["user"][name])) for name, stat in statistics.items()}
  return AnalysisResult(summary=summary, stats=stats, user=user)


def _sink_ablate_heads(sink: dict) -> tuple[np.ndarray, str]:
  """The sink-reading heads, or, where there are none, the top-scoring head of each layer."""
  heads = np.asarray(sink["sink_heads"])
  if heads.any():
    return heads, "sink-reading heads (mean a_i0 over i >= min_query above epsilon)"
  score = np.asarray(sink["sink_score"])
  top = np.zeros_like(heads)
  top[np.arange(score.shape[0]), score.argmax(1)] = True
  return top, "no sink-reading head: the highest-scoring head of each layer"


def _interventions(model, graphdef, params, sequences, main, visible, m, options) -> dict:
  toks = sequences[main]
  other_policy = [p for p in sequences if p != main]
  # pos0_patch source: the other policy's next sequence (a different x_0), else main's next sequence.
  source = np.roll(sequences[other_policy[0]] if other_policy else toks, -1, axis=0)
  embed = model.embed[...]

  def pos0_source(mdl, tokens, src):
    return interventions.pos0_patch(jnp.moveaxis(forward(mdl, src)["resid"][:, :, 0], 1, 0))

  specs = {f"bos_replace.{kind}": (lambda mdl, t, s, kind=kind: interventions.bos_replace(
      embed, kind, token=options.bos_replace_token)) for kind in interventions.BOS_REPLACEMENTS}
  specs["pos0_patch"] = pos0_source
  heads, heads_rule = _sink_ablate_heads(m["sinks"])
  reduced = interventions.without_sink_cells(visible)
  design = fixed_effects.make_design(visible)
  reduced_design = fixed_effects.make_design(reduced)
  runs = {name: (fn, visible, design) for name, fn in specs.items()}
  runs["sink_ablate.reference"] = (lambda mdl, t, s: {}, reduced, reduced_design)
  runs["sink_ablate"] = (lambda mdl, t, s: interventions.sink_ablate(heads), reduced, reduced_design)
  L, H, T = model.spec.num_layers, model.spec.num_heads, toks.shape[1]
  results = {}
  for name, (fn, vis, des) in runs.items():
    step = jax.jit(make_intervention_step(graphdef, visible, vis, fn), donate_argnums=1)
    acc = {"leakage": leakage.init(L, H, T), "denominators": denominators.init(L, H, T)}
    acc = _sweep(lambda a, t, s, src: step(params, a, t, s, src), acc, toks, options, f"intervention[{name}]",
                 source)
    results[name] = (leakage.finalize(acc["leakage"], des, early_max=options.early_max),
                     denominators.finalize(acc["denominators"], visible))
  out: dict = {"bos_replace": {}}
  for name, (fin, den) in results.items():
    if name == "sink_ablate.reference":
      continue
    before = results["sink_ablate.reference"][0] if name == "sink_ablate" else m["leakage"]
    entry = _removed(before, fin)
    entry["sink_mass_after"] = _tolist(den["sink_mass"][..., options.sink_min_query:].mean((-1, -2)))
    if name.startswith("bos_replace."):
      out["bos_replace"][name.split(".", 1)[1]] = entry
    else:
      out[name] = entry
  out["sink_ablate"]["heads"] = [[int(l), int(h)] for l, h in zip(*np.nonzero(heads))]
  out["sink_ablate"]["heads_rule"] = heads_rule
  out["sink_ablate"]["cells"] = "key 0 excluded for queries i >= 1, before and after"
  out["bos_replace"]["token_id"] = int(options.bos_replace_token)
  out["pos0_patch"]["source"] = (f"position-0 stream of the next sequence under bos={other_policy[0]!r}"
                                 if other_policy else "position-0 stream of the next sequence")
  return out
