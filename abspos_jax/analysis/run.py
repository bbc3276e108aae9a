"""The analysis API: ``analyze(model, sequences) -> AnalysisResult``.

Two sweeps over the sequences. The baseline sweep runs
:func:`analysis_pass.make_baseline_step` on the main BOS policy's sequences
(``prepend``: position 0 is BOS; ``none``: position 0 is a text token) and
:func:`analysis_pass.make_position0_step` on the other's (its fingerprint of
``x_0``, loss and closedness: nothing else of it is reported). The
intervention sweep reruns the main policy's sequences with each intervention
and measures the fraction of each leakage component it removes. Everything is
a sum accumulated batch by batch on the device; ``finalize`` turns the sums
into results.
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import masks
from abspos_jax.analysis import (denominators, fixed_effects, intervals, interventions, leakage, memory, position0,
                                 probes, sinks)
from abspos_jax.analysis.analysis_pass import (Statistic, forward, init_accumulators, init_position0_pass,
                                               make_baseline_step, make_intervention_step, make_position0_step)
from abspos_jax.analysis.fixed_effects import FEDesign
from abspos_jax.model import Decoder, ModelSpec

POLICIES = ("prepend", "none")


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
  batch_size: int = 32  # the largest batch; smaller where a batch would not fit memory_budget_gb
  memory_budget_gb: float | None = None  # what a step may allocate; None: half the memory free at the start
  early_max: int = 16  # early queries: 1 <= i < early_max
  sink_epsilon: float = 0.3  # Gu et al. (2024)
  sink_min_query: int = 4
  probe_ridge: float = 1e-2
  interventions: bool = True
  bos_replace_token: int = 10  # the "another token" of bos_replace: newline
  closedness_sequences: int = 4  # how many sequences per sweep (the first ones) the closedness check reruns
  num_blocks: int = 16  # sequence blocks (seq_id % num_blocks) of the cross-fit halves and the jackknife
  progress: bool = True

  def validate(self) -> None:
    """Raises ``ValueError`` naming the field for a value the estimators cannot use."""
    if self.batch_size < 1:
      raise ValueError(f"batch_size (AnalysisOptions.batch_size) must be >= 1, got {self.batch_size}")
    if self.num_blocks < 2 or self.num_blocks % 2:
      raise ValueError(f"num_blocks (AnalysisOptions.num_blocks) must be an even number >= 2 (half = block % 2), "
                       f"got {self.num_blocks}")
    if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
      raise ValueError(f"memory_budget_gb (AnalysisOptions.memory_budget_gb) must be > 0, got {self.memory_budget_gb}")
    if self.early_max < 2:
      raise ValueError(f"early_max (AnalysisOptions.early_max) must be >= 2, got {self.early_max}")


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

  ``step`` donates ``acc``; a leaf that shares its buffer with an earlier one
  is copied first, because init functions may hand one zeros array to several
  leaves and a buffer cannot be donated twice (copying only those keeps the
  accumulators' memory at 1x: 4.3 GiB for the probe of a 2,048-wide model).
  The bar advances when a batch has been computed, not when it has been
  dispatched.
  """
  seen: set[int] = set()

  def own(x: jax.Array) -> jax.Array:
    if id(x) in seen:
      return jnp.copy(x)
    seen.add(id(x))
    return x

  acc = jax.tree.map(own, acc)
  with _bar(len(tokens), desc, options.progress) as bar:
    for start in range(0, len(tokens), options.batch_size):
      stop = min(start + options.batch_size, len(tokens))
      args = [jnp.asarray(x[start:stop]) for x in extra]
      acc = jax.block_until_ready(step(acc, jnp.asarray(tokens[start:stop]), jnp.arange(start, stop), *args))
      bar.update(stop - start)
  return acc


def fingerprint_groups(sequences: Mapping[str, np.ndarray], vocab_size: int) -> tuple[int, np.ndarray]:
  """One fingerprint group per first token that occurs: ``(num_groups, x0_groups int [vocab_size])``."""
  first_tokens = np.unique(np.concatenate([np.asarray(t)[:, 0] for t in sequences.values()]))
  x0_groups = np.zeros(vocab_size, np.int32)
  x0_groups[first_tokens] = np.arange(len(first_tokens))
  return len(first_tokens), x0_groups


def finalize_core(acc: dict, visible: jax.Array, design: FEDesign,
                  options: AnalysisOptions = AnalysisOptions(), keep: jax.Array | None = None
                  ) -> dict[str, dict[str, jax.Array]]:
  """Results of the core accumulators (``analysis_pass.init_core``) over the kept blocks; jittable.

  Returns ``denominators`` (``denominators.finalize``), ``leakage``
  (``leakage.finalize`` with ``options.early_max``), ``position0``
  (``position0.finalize``) and ``sinks`` (``sinks.sink_statistics`` with
  ``options.sink_min_query`` and ``options.sink_epsilon``).
  """
  den = denominators.finalize(acc["denominators"], visible, keep)
  return {"denominators": den,
          "leakage": leakage.finalize(acc["leakage"], design, keep, early_max=options.early_max),
          "position0": position0.finalize(acc["position0"]),
          "sinks": sinks.sink_statistics(den["sink_mass_half"], visible, min_query=options.sink_min_query,
                                         epsilon=options.sink_epsilon)}


# The numbers that carry an interval: (group, key) of finalize_core's results, plus the probes.
_LEAKAGE_CI = tuple(f"{p}{k}{scope}" for p in ("", "early_")
                    for k in ("share_mask", "share_res", "leakage_share", "var_phi", "var_mask", "var_res",
                              "cov_mask", "cov_res")
                    for scope in ("", "_layer", "_overall")) + tuple(
                        f"leakage_{x}{scope}" for x in ("s", "loga") for scope in ("", "_layer", "_overall"))
_SINKS_CI = ("sink_score", "sink_score_max", "sink_score_max_layer")
_PROBES = ("probe_resid", "probe_attn", "probe_attn_raw")


def _jackknife_core(acc: dict, visible: jax.Array, design: FEDesign, options: AnalysisOptions) -> dict:
  """:func:`intervals.evaluate` of every number in ``_LEAKAGE_CI`` and ``_SINKS_CI``."""
  def estimates(keep, acc, visible, design):
    fin = finalize_core(acc, visible, design, options, keep)
    return {**{f"leakage.{k}": fin["leakage"][k] for k in _LEAKAGE_CI},
            **{f"sinks.{k}": fin["sinks"][k] for k in _SINKS_CI}}

  return intervals.evaluate(estimates, options.num_blocks, acc, visible, design)


@functools.partial(jax.jit, static_argnames="ridge")
def _finalize_probe(acc: dict, ridge: float) -> dict:
  """``probes.finalize`` as one program (the caller waits for it before the next: see ``probes.finalize``)."""
  return probes.finalize(acc, ridge=ridge)


def _jackknife_probe(acc: dict, ridge: float, num_blocks: int) -> jax.Array:
  return intervals.evaluate(lambda keep, acc: probes.finalize(acc, keep, ridge=ridge)["r2"], num_blocks, acc)


def _jackknife_baseline(acc: dict, visible: jax.Array, design: FEDesign, options: AnalysisOptions) -> dict:
  """The core numbers' and the probes' leave-one-block-out values.

  Separate programs, one at a time: two batched LU solves running at once
  deadlocked XLA CPU's intra-op pool (``probes.finalize``).
  """
  out = dict(_jackknife_core(acc, visible, design, options))
  for name in _PROBES:
    out[f"{name}.r2"] = _jackknife_probe(acc[name], options.probe_ridge, options.num_blocks)
  return out


def _tolist(x) -> Any:
  """JSON-ready: arrays to nested lists, NaN/inf to None."""
  a = np.asarray(x, dtype=np.float64)
  if a.ndim == 0:
    return float(a) if np.isfinite(a) else None
  return [_tolist(v) for v in a]


def _ci(ci: dict, key: str) -> Any:
  """``[lo, hi]`` (nested per element for arrays) of ``key`` in an ``intervals.summarize`` result."""
  return _tolist(np.stack([ci["lo"][key], ci["hi"][key]], -1))


def _components(ci: dict) -> dict:
  """``components`` of summary.json: the v2 shares with their intervals (``*_ci``: ``[lo, hi]``)."""
  out = {}
  v = lambda key: _tolist(ci["value"][f"leakage.{key}"])  # noqa: E731
  for prefix, suffix in (("", ""), ("early_", "_early")):
    pooled, per_head = {}, {}
    for comp, share, var in (("causal_mask", "share_mask", "var_mask"), ("residual_stream", "share_res", "var_res")):
      out[comp + suffix] = v(f"{prefix}{share}_layer")
      out[f"{comp}{suffix}_ci"] = _ci(ci, f"leakage.{prefix}{share}_layer")
      pooled[comp] = v(f"{prefix}{share}_overall")
      pooled[f"{comp}_ci"] = _ci(ci, f"leakage.{prefix}{share}_overall")
      pooled[f"{comp}_var"] = v(f"{prefix}{var}_overall")
      pooled[f"{comp}_var_ci"] = _ci(ci, f"leakage.{prefix}{var}_overall")
      per_head[comp] = v(f"{prefix}{share}")
      per_head[f"{comp}_ci"] = _ci(ci, f"leakage.{prefix}{share}")
    pooled["leakage_share"] = v(f"{prefix}leakage_share_overall")
    pooled["leakage_share_ci"] = _ci(ci, f"leakage.{prefix}leakage_share_overall")
    out["pooled" + suffix] = pooled
    out["per_head" + suffix] = per_head
    out["leakage_share" + suffix] = v(f"{prefix}leakage_share_layer")
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
  options.validate()
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
  baseline_step = jax.jit(make_baseline_step(graphdef, design, statistics, jnp.asarray(x0_groups),
                                             options.closedness_sequences), donate_argnums=1)
  position0_step = jax.jit(make_position0_step(graphdef, jnp.asarray(x0_groups), options.closedness_sequences),
                           donate_argnums=1)
  init = functools.partial(init_accumulators, spec, seq_len, statistics, options.num_blocks, num_groups=num_groups)
  init_other = functools.partial(init_position0_pass, spec, num_groups)
  others = [p for p in sequences if p != main]
  held = _nbytes(jax.eval_shape(init)) + len(others) * _nbytes(jax.eval_shape(init_other))
  options, step_memory = _fit_batch_size(baseline_step, params, jax.eval_shape(init), sequences, options, held)
  acc = _sweep(lambda a, t, s: baseline_step(params, a, t, s), init(), sequences[main], options,
               f"analysis[{main}]")
  finals = {main: {**jax.jit(finalize_core, static_argnames="options")(acc, visible, design, options),
                   **{name: jax.block_until_ready(_finalize_probe(acc[name], options.probe_ridge))
                      for name in _PROBES},
                   "acc": acc}}
  del acc
  for policy in others:
    acc = _sweep(lambda a, t, s: position0_step(params, a, t, s), init_other(), sequences[policy], options,
                 f"analysis[{policy}]")
    finals[policy] = {"position0": jax.jit(position0.finalize)(acc["position0"]), "acc": acc}
  m = finals[main]
  ci = intervals.summarize(_jackknife_baseline(m["acc"], visible, design, options), m["acc"]["leakage"]["n"])
  value = ci["value"]
  summary: dict = {
      "estimators": "v2",
      "main_policy": main, "num_sequences": int(len(sequences[main])), "seq_len": int(seq_len),
      "position": spec.position, "num_layers": L, "num_heads": spec.num_heads,
      "batch_size": options.batch_size, "memory": step_memory,
      "intervals": {"method": "delete-one-block jackknife over sequence blocks (seq_id % num_blocks), t quantile",
                    "level": intervals.LEVEL, "num_blocks": options.num_blocks,
                    "nonempty_blocks": int((np.asarray(m["acc"]["leakage"]["n"]) > 0).sum())},
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
      "leakage": {},
      "components": _components(ci),
      "position0": {"norm": _tolist(m["position0"]["pos0_norm"]),
                    "norm_ratio": _tolist(m["position0"]["pos0_norm_ratio"]),
                    "cos_prev": _tolist(m["position0"]["pos0_cos_prev"])},
      "fingerprint": {},
      "sink_rate": _tolist(m["sinks"]["sink_rate"]),
      "sink_score_max": _tolist(value["sinks.sink_score_max"]),
      "sink_score_max_ci": _ci(ci, "sinks.sink_score_max"),
      "sink_score_max_layer": _tolist(value["sinks.sink_score_max_layer"]),
      "sink_score_max_layer_ci": _ci(ci, "sinks.sink_score_max_layer"),
      "sink_heads": [[int(l), int(h)] for l, h in zip(*np.nonzero(np.asarray(m["sinks"]["sink_heads"])))],
      "sink_selection": "heads chosen on the even sequence blocks (score > epsilon), scores measured on the odd ones",
      "probes": {},
  }
  for key, name in (("logits", "s"), ("log_weights", "loga")):
    for scope in ("_layer", "_overall"):
      summary["leakage"][key + scope] = _tolist(value[f"leakage.leakage_{name}{scope}"])
      summary["leakage"][f"{key}{scope}_ci"] = _ci(ci, f"leakage.leakage_{name}{scope}")
  for key, name in (("residual_r2", "probe_resid"), ("attention_r2", "probe_attn"),
                    ("attention_raw_r2", "probe_attn_raw")):
    summary["probes"][key] = _tolist(value[f"{name}.r2"])
    summary["probes"][key + "_ci"] = _ci(ci, f"{name}.r2")
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
  for name in ("phi_s", "phi_zmask", "phi_zres", "phi_loga", "zmask"):
    stats[name] = np.asarray(m["leakage"][name])
  for name in ("share_mask", "share_res", "early_share_mask", "early_share_res", "leakage_s", "leakage_loga"):
    stats[name] = np.asarray(value[f"leakage.{name}"])
    stats[name + "_lo"], stats[name + "_hi"] = np.asarray(ci["lo"][f"leakage.{name}"]), np.asarray(
        ci["hi"][f"leakage.{name}"])
  for name in ("pos0_norm_ratio", "pos0_cos_prev", "fingerprint_spread"):
    stats[name] = np.asarray(m["position0"][name])
  stats["sink_score"] = np.asarray(value["sinks.sink_score"])
  stats["sink_score_lo"], stats["sink_score_hi"] = np.asarray(ci["lo"]["sinks.sink_score"]), np.asarray(
      ci["hi"]["sinks.sink_score"])
  stats["sink_score_select"] = np.asarray(m["sinks"]["sink_score_select"])
  stats["probe_resid_r2"] = np.asarray(value["probe_resid.r2"])
  stats["probe_attn_r2"] = np.asarray(value["probe_attn.r2"])
  stats["probe_attn_raw_r2"] = np.asarray(value["probe_attn_raw.r2"])
  other = [p for p in sequences if p != main]
  if other:
    stats["tokens_" + other[0]] = np.asarray(sequences[other[0]])
    stats["fingerprint_spread_" + other[0]] = np.asarray(finals[other[0]]["position0"]["fingerprint_spread"])

  if options.interventions:
    summary["interventions"] = _interventions(model, graphdef, params, sequences, main, visible, m, options)
  user = {name: jax.device_get(stat.finalize(m["acc"]["user"][name])) for name, stat in statistics.items()}
  return AnalysisResult(summary=summary, stats=stats, user=user)


def _nbytes(tree: Any) -> int:
  """Bytes of the arrays (or ``ShapeDtypeStruct`` s) of ``tree``."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _fit_batch_size(step, params, acc, sequences: Mapping[str, np.ndarray],
                    options: AnalysisOptions, held: int) -> tuple[AnalysisOptions, dict]:
  """``options`` with the largest batch size (up to ``options.batch_size``) whose baseline step fits the budget.

  The budget is ``memory_budget_gb`` or half of what is free now
  (:func:`memory.available_bytes`) once the accumulators the analysis will
  hold (``held`` bytes, not allocated yet) are taken out: for a 1B model at
  2,048 tokens they are gigabytes (the residual probe's blocked Gram
  matrices). The batch is also capped at :func:`memory.logits_batch_cap`
  (one layer's logits within 256 MiB: larger batches are slower on the CPU).
  The compiled programs are the ones the sweep then runs (jit reuses them).
  Returns the options and the summary's ``memory`` entry.
  """
  free = memory.available_bytes() - held
  if options.memory_budget_gb is None and free <= 0:
    raise ValueError(f"the analysis accumulators alone need {held / memory.GiB:.2f} GiB and "
                     f"{memory.available_bytes() / memory.GiB:.2f} GiB are free; analyse shorter sequences "
                     f"(--seq_len) or use fewer num_blocks")
  budget = free // 2 if options.memory_budget_gb is None else int(options.memory_budget_gb * memory.GiB)
  seq_len = next(iter(sequences.values())).shape[1]

  def compile_for(b: int):
    return step.lower(params, acc, jax.ShapeDtypeStruct((b, seq_len), jnp.int32),
                      jax.ShapeDtypeStruct((b,), jnp.int32)).compile()

  largest = min(options.batch_size, max(len(t) for t in sequences.values()),
                memory.logits_batch_cap(acc["leakage"]["lz"].shape[2], seq_len))
  batch, used = memory.choose_batch_size(compile_for, largest, budget,
                                         what=f"the analysis step at {seq_len} tokens")
  return dataclasses.replace(options, batch_size=batch), {
      "budget_gib": budget / memory.GiB, "step_gib": used / memory.GiB,
      "accumulators_gib": held / memory.GiB,
      "budget_rule": ("memory_budget_gb" if options.memory_budget_gb is not None
                      else "half the memory free at the start, less the accumulators"),
      "step_rule": "the compiled baseline step's scratch + outputs - donated buffers (XLA memory analysis)"}


def _sink_ablate_heads(sink: dict) -> tuple[np.ndarray, str]:
  """The sink-reading heads, or, where there are none, the top-scoring head of each layer (half-0 scores)."""
  heads = np.asarray(sink["sink_heads"])
  if heads.any():
    return heads, "sink-reading heads (half-0 mean a_i0 over the queries i >= min_query that see key 0 > epsilon)"
  score = np.nan_to_num(np.asarray(sink["sink_score_select"]), nan=-np.inf)
  top = np.zeros_like(heads)
  top[np.arange(score.shape[0]), score.argmax(1)] = True
  return top, "no sink-reading head: the highest-scoring head of each layer (half-0 scores)"


REMOVAL_RTOL = 1e-5  # a component below this fraction of Var(phi_loga) counts as zero
_COMPONENT_KEYS = {"causal_mask": "cov_mask", "residual_stream": "cov_res"}


def _effect(before: dict, design_before: FEDesign, after: dict, design_after: FEDesign, early_max: int,
            num_blocks: int) -> dict:
  """Per leave-one-block-out: each component's covariance before, its change and the fraction removed."""
  def estimates(keep, before, design_before, after, design_after):
    b = leakage.finalize(before, design_before, keep, early_max=early_max)
    a = leakage.finalize(after, design_after, keep, early_max=early_max)
    out = {}
    for prefix in ("", "early_"):
      for key in _COMPONENT_KEYS.values():
        for scope in ("_overall", "_layer"):
          k = prefix + key + scope
          out[k + ".before"] = b[k]
          out[k + ".change"] = a[k] - b[k]
          out[k + ".removed"] = 1.0 - a[k] / b[k]
          out[k + ".scale"] = b[prefix + "var_phi" + scope]
    return out

  return intervals.evaluate(estimates, num_blocks, before, design_before, after, design_after)


def _effect_entry(ci: dict) -> dict:
  """An intervention's summary entry: changes (nats^2) with intervals, fractions only where clearly defined."""
  out = {}
  for prefix, suffix in (("", ""), ("early_", "_early")):
    for comp, key in _COMPONENT_KEYS.items():
      for scope, tail in (("_overall", ""), ("_layer", "_per_layer")):
        k = prefix + key + scope
        lo, hi = np.asarray(ci["lo"][k + ".before"]), np.asarray(ci["hi"][k + ".before"])
        # Clearly non-zero: the interval excludes 0 and the value is above float error (a deterministic
        # model has zero-width intervals around rounding noise).
        clear = intervals.excludes_zero(lo, hi) & (np.abs(np.asarray(ci["value"][k + ".before"]))
                                                   > REMOVAL_RTOL * np.abs(np.asarray(ci["value"][k + ".scale"])))
        removed = np.where(clear, np.asarray(ci["value"][k + ".removed"]), np.nan)
        out[f"{comp}_before{suffix}{tail}"] = _tolist(ci["value"][k + ".before"])
        out[f"{comp}_before{suffix}{tail}_ci"] = _ci(ci, k + ".before")
        out[f"{comp}_change{suffix}{tail}"] = _tolist(ci["value"][k + ".change"])
        out[f"{comp}_change{suffix}{tail}_ci"] = _ci(ci, k + ".change")
        out[f"{comp}_removed{suffix}{tail}"] = _tolist(removed)
        out[f"{comp}_removed{suffix}{tail}_ci"] = _tolist(np.where(
            clear[..., None], np.stack([ci["lo"][k + ".removed"], ci["hi"][k + ".removed"]], -1), np.nan))
        if not np.all(clear):
          out[f"{comp}_removed{suffix}{tail}_reason"] = (
              "null where the component before is not clearly non-zero (its interval includes 0, or it is below "
              f"{REMOVAL_RTOL:g} of Var(phi_loga))")
  return out


def _interventions(model, graphdef, params, sequences, main, visible, m, options) -> dict:
  toks = sequences[main]
  other_policy = [p for p in sequences if p != main]
  # pos0_patch source: the other policy's next sequence (a different x_0), else main's next sequence.
  source = np.roll(sequences[other_policy[0]] if other_policy else toks, -1, axis=0)
  embed = model.embed[...]
  L, H, T = model.spec.num_layers, model.spec.num_heads, toks.shape[1]
  design = fixed_effects.make_design(visible)
  heads, heads_rule = _sink_ablate_heads(m["sinks"])
  cells = interventions.sink_cells(visible, heads)
  sink_design = fixed_effects.make_design(cells)  # the ablated pass: its heads normalise over the cells
  reference_design = fixed_effects.make_design(cells, keys=fixed_effects.layer_mask(visible))  # ... over key 0 too

  def pos0_source(mdl, tokens, src):
    return interventions.pos0_patch(jnp.moveaxis(forward(mdl, src)["resid"][:, :, 0], 1, 0))

  def sweep(name: str, edits_fn, cell_design: FEDesign) -> dict:
    step = jax.jit(make_intervention_step(graphdef, cell_design, edits_fn), donate_argnums=1)
    acc = {"leakage": leakage.init(L, H, T, options.num_blocks),
           "denominators": denominators.init(L, H, T, options.num_blocks)}
    return _sweep(lambda a, t, s, src: step(params, a, t, s, src), acc, toks, options, f"intervention[{name}]",
                  source)

  def entry(before_acc: dict, before_design: FEDesign, after: dict, after_design: FEDesign) -> dict:
    ci = intervals.summarize(_effect(before_acc, before_design, after["leakage"], after_design, options.early_max,
                                     options.num_blocks), m["acc"]["leakage"]["n"])
    out = _effect_entry(ci)
    den = denominators.finalize(after["denominators"], visible)
    use = np.asarray(sinks.scored_queries(visible, options.sink_min_query))
    use = use if use.ndim == 1 else use[:, None, :]
    mass = np.asarray(den["sink_mass"])
    out["sink_mass_after"] = _tolist(((mass * use).sum(-1) / np.maximum(use.sum(-1), 1)).mean(-1))
    return out

  out: dict = {"bos_replace": {}}
  if main == "prepend":
    for kind in interventions.BOS_REPLACEMENTS:
      acc = sweep(f"bos_replace.{kind}", lambda mdl, t, s, kind=kind: interventions.bos_replace(
          embed, kind, token=options.bos_replace_token), design)
      out["bos_replace"][kind] = entry(m["acc"]["leakage"], design, acc, design)
    out["bos_replace"]["token_id"] = int(options.bos_replace_token)
  else:
    out["bos_replace"]["skipped"] = (f"bos_replace replaces the BOS embedding at position 0; under the main policy "
                                     f"{main!r} position 0 holds a text token, so it does not run")
  out["pos0_patch"] = entry(m["acc"]["leakage"], design, sweep("pos0_patch", pos0_source, design), design)
  out["pos0_patch"]["source"] = (f"position-0 stream of the next sequence under bos={other_policy[0]!r}"
                                 if other_policy else "position-0 stream of the next sequence")
  reference = sweep("sink_ablate.reference", lambda mdl, t, s: {}, reference_design)
  ablated = sweep("sink_ablate", lambda mdl, t, s: interventions.sink_ablate(heads), sink_design)
  out["sink_ablate"] = entry(reference["leakage"], reference_design, ablated, sink_design)
  out["sink_ablate"]["heads"] = [[int(l), int(h)] for l, h in zip(*np.nonzero(heads))]
  out["sink_ablate"]["heads_rule"] = heads_rule
  out["sink_ablate"]["cells"] = ("per head, the same cells before and after: the model's mask, without key 0 for "
                                 "queries i >= 1 in the ablated heads; each pass's mask-only normaliser counts the "
                                 "keys its softmax normalises over (i + 1 before, i after in an ablated head)")
  return out
