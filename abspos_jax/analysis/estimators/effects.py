"""The interventions' effects: each reruns the main policy's sequences with one edit and measures its leakage.

The edits themselves are in :mod:`interventions` (pure functions of the
model's arrays); this module holds the registry of what summary.json's
``interventions`` reports (:func:`registry`: one :class:`Intervention` each)
and :func:`run`, which measures each one's change of the two leakage
components against the pass it is compared with, with jackknife intervals.
A component's fraction removed (``1 - after / before``) is given only where
the component before is clearly non-zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax.analysis.estimators import denominators, fixed_effects, intervals, leakage, sinks

from abspos_jax.analysis.passes import edits, memory

from abspos_jax.analysis.outputs import schema
from abspos_jax.analysis.passes.steps import CompiledStep, forward, make_intervention_step, sweep
from abspos_jax.analysis.estimators.fixed_effects import FEDesign
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.model import Decoder


REMOVAL_RTOL = 1e-5  # a component below this fraction of Var(phi_loga) counts as zero
_COMPONENT_KEYS = {"causal_mask": "cov_mask", "residual_stream": "cov_res"}


@dataclasses.dataclass(frozen=True)
class Intervention:
  """One entry of summary.json's ``interventions`` (``name``: its key path, e.g. ``bos_replace.mean``).

  ``edits(model, tokens, source, operand, query_block=None) -> {hook point: Edit}`` builds the
  pass's edits inside the trace (``source``: another sequence per row, for
  ``pos0_patch``; ``operand``: this intervention's arrays, a traced input, so
  that the interventions sharing one ``edits`` function share one compiled
  pass). The pass is measured on ``design`` (None: the model's mask) and
  compared with the baseline pass, or, with ``reference``, with the same
  pass under ``reference_operand`` measured on that design. ``info`` goes into
  the entry as it is.
  """
  name: str
  edits: Callable[[Decoder, jax.Array, jax.Array, Any], dict]
  operand: Any = ()
  design: FEDesign | None = None
  reference: FEDesign | None = None
  reference_operand: Any = ()
  info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def sink_ablate_heads(sink: dict) -> tuple[np.ndarray, str]:
  """The sink-reading heads, or, where there are none, the top-scoring head of each layer (half-0 scores)."""
  heads = np.asarray(sink["sink_heads"])
  if heads.any():
    return heads, "sink-reading heads (half-0 mean a_i0 over the queries i >= min_query that see key 0 > epsilon)"
  score = np.nan_to_num(np.asarray(sink["sink_score_select"]), nan=-np.inf)
  top = np.zeros_like(heads)
  top[np.arange(score.shape[0]), score.argmax(1)] = True
  return top, "no sink-reading head: the highest-scoring head of each layer (half-0 scores)"


def _bos_replace(model: Decoder, tokens: jax.Array, source: jax.Array, replacement: dict, query_block=None) -> dict:
  return edits.bos_replace(replacement)


def _pos0_patch(model: Decoder, tokens: jax.Array, source: jax.Array, operand: Any, query_block=None) -> dict:
  # Position 0 sees only itself (closedness), so the source's stream there is that of its first token alone:
  # a forward over one token, not over the source's T (which made this pass cost 1.6x a baseline one).
  resid = forward(model, source[:, :1])["resid"]
  return edits.pos0_patch(jnp.moveaxis(resid[:, :, 0], 1, 0))


def _sink_ablate(model: Decoder, tokens: jax.Array, source: jax.Array, heads: jax.Array, query_block=None) -> dict:
  return edits.sink_ablate(heads)


def sink_designs(visible: jax.Array, heads: np.ndarray) -> tuple[FEDesign, FEDesign]:
  """``sink_ablate``'s designs per head, ``[L, H]`` fields: the ablated pass's, where the ablated heads
  normalise over their cells (:func:`edits.sink_cells`), and the reference pass's, the same cells normalised
  over the model's keys (key 0 included). Equal to ``make_design(sink_cells(visible, heads))`` and
  ``make_design(cells, keys=layer_mask(visible))``, but assembled from the three designs of each distinct
  layer mask (kept, ablated, ablated over the model's keys): ``O(T^2)`` host work per distinct mask and
  ``O(L H T)`` memory, where the ``[L, H, T, T]`` cells are 17 GB for SmolLM2 at 8,192 tokens."""
  heads = np.asarray(heads, bool)
  vis = np.asarray(visible, bool)
  layers = [vis] * heads.shape[0] if vis.ndim == 2 else list(vis)
  per_mask: dict[bytes, tuple[FEDesign, ...]] = {}
  tags = []
  for m in layers:
    tags.append(m.tobytes() if vis.ndim == 3 else b"")
    if tags[-1] not in per_mask:
      cells = np.asarray(edits.sink_cells(m, np.ones((1, 1), bool)))[0, 0]
      per_mask[tags[-1]] = (fixed_effects.make_design(m), fixed_effects.make_design(cells),
                            fixed_effects.make_design(cells, keys=m))

  def assemble(ablated: int) -> FEDesign:
    pick = [[per_mask[tag][ablated if a else 0] for a in row] for tag, row in zip(tags, heads)]
    return FEDesign(*(jnp.asarray(np.stack([np.stack([np.asarray(d[f]) for d in row]) for row in pick]))
                      for f in range(len(FEDesign._fields))))

  return assemble(1), assemble(2)


def registry(embed: jax.Array, main: str, other_policy: str | None, visible: jax.Array, sink: dict,
             options: AnalysisOptions) -> list[Intervention]:
  """The interventions of one analysis: BOS replacement (under ``main == "prepend"`` only: elsewhere position 0
  holds a text token), the position-0 patch and the sink ablation (its reference: the same pass with no head
  ablated). Each edits function's interventions come together: :func:`run` keeps one compiled pass at a time."""
  out = []
  if main == "prepend":
    for kind in edits.BOS_REPLACEMENTS:
      out.append(Intervention(f"bos_replace.{kind}", _bos_replace,
                              edits.bos_replacement(embed, kind, token=options.bos_replace_token)))
  source = (f"position-0 stream of the next sequence under bos={other_policy!r}" if other_policy else
            "position-0 stream of the next sequence")
  out.append(Intervention("pos0_patch", _pos0_patch, info={"source": source}))
  heads, rule = sink_ablate_heads(sink)
  design, reference = sink_designs(visible, heads)
  out.append(Intervention(
      "sink_ablate", _sink_ablate, jnp.asarray(heads, bool), design=design, reference=reference,
      reference_operand=jnp.zeros(heads.shape, bool),
      info={"heads": [[int(l), int(h)] for l, h in zip(*np.nonzero(heads))], "heads_rule": rule,
            "cells": "per head, the same cells before and after: the model's mask, without key 0 for queries i >= 1 "
                     "in the ablated heads; each pass's mask-only normaliser counts the keys its softmax normalises "
                     "over (i + 1 before, i after in an ablated head)"}))
  return out


def _components_kept(keep: jax.Array, acc: dict, design: FEDesign, *, early_max: int) -> dict:
  """What an effect reads of one pass's ``leakage.finalize`` over the kept blocks: each component's covariance
  and ``Var(phi_loga)`` (module level, as :func:`intervals.evaluate` calls it: compiled once per design shape,
  and only these outputs)."""
  fin = leakage.finalize(acc, design, keep, early_max=early_max)
  return {prefix + key + scope: fin[prefix + key + scope] for prefix in ("", "early_")
          for key in (*_COMPONENT_KEYS.values(), "var_phi") for scope in ("_overall", "_layer")}


def _leakage_rows(acc: dict, design: FEDesign, early_max: int, num_blocks: int) -> dict:
  """One pass's :func:`_components_kept` over all blocks, then with each block left out (stacked)."""
  return intervals.evaluate(_components_kept, num_blocks, acc, design, early_max=early_max)


def _effect(before: dict, after: dict) -> dict:
  """Per row of :func:`_leakage_rows` (all blocks, then each left out): each component's covariance before,
  its change and the fraction removed, and ``Var(phi_loga)`` before as its scale (on the host)."""
  before, after = jax.device_get(before), jax.device_get(after)
  out = {}
  for prefix in ("", "early_"):
    for key in _COMPONENT_KEYS.values():
      for scope in ("_overall", "_layer"):
        k = prefix + key + scope
        out[k + ".before"] = before[k]
        out[k + ".change"] = after[k] - before[k]
        with np.errstate(divide="ignore", invalid="ignore"):
          out[k + ".removed"] = 1.0 - after[k] / before[k]
        out[k + ".scale"] = before[prefix + "var_phi" + scope]
  return out


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
        out.update(schema.with_ci(ci, k + ".before", f"{comp}_before{suffix}{tail}"))
        out.update(schema.with_ci(ci, k + ".change", f"{comp}_change{suffix}{tail}"))
        out[f"{comp}_removed{suffix}{tail}"] = schema.tolist(np.where(clear, np.asarray(ci["value"][k + ".removed"]),
                                                                      np.nan))
        out[f"{comp}_removed{suffix}{tail}_ci"] = schema.tolist(np.where(
            clear[..., None], np.stack([ci["lo"][k + ".removed"], ci["hi"][k + ".removed"]], -1), np.nan))
        if not np.all(clear):
          out[f"{comp}_removed{suffix}{tail}_reason"] = (
              "null where the component before is not clearly non-zero (its interval includes 0, or it is below "
              f"{REMOVAL_RTOL:g} of Var(phi_loga))")
  return out


def _sink_mass_after(den_acc: dict, visible: jax.Array, min_query: int) -> Any:
  """Per layer, the mean over heads of the mean sink mass over the scored queries of the edited pass."""
  mass = np.asarray(denominators.finalize(den_acc, visible)["sink_mass"])
  use = np.asarray(sinks.scored_queries(visible, min_query))
  use = use if use.ndim == 1 else use[:, None, :]
  return schema.tolist(((mass * use).sum(-1) / np.maximum(use.sum(-1), 1)).mean(-1))


def run(model: Decoder, sequences: Mapping[str, np.ndarray], main: str, visible: jax.Array, baseline: dict,
        options: AnalysisOptions) -> dict:
  """summary.json's ``interventions``: each of :func:`registry`'s, measured against its comparison pass.

  ``baseline``: the main policy's finalized core results with its accumulators
  under ``"acc"`` (``run.analyze``).
  """
  graphdef, params = nnx.split(model, nnx.Param)
  toks = sequences[main]
  others = [p for p in sequences if p != main]
  # pos0_patch's source: the other policy's next sequence (a different x_0), else main's next sequence.
  source = np.roll(sequences[others[0]] if others else toks, -1, axis=0)
  spec, design = model.spec, fixed_effects.make_design(visible)

  steps: dict[Callable, CompiledStep] = {}  # the compiled pass of the edits function running now

  def measured(name: str, edits_fn: Callable, operand: Any, on: FEDesign) -> dict:
    if edits_fn not in steps:
      # registry() lists each edits function's interventions together: the finished one's program, which keeps
      # its scratch once run, goes.
      steps.clear()
      memory.release_free_pages()
      steps[edits_fn] = CompiledStep(make_intervention_step(graphdef, edits_fn, options.query_block))
    acc = {"leakage": leakage.init(spec.num_layers, spec.num_heads, toks.shape[1], options.num_blocks),
           "denominators": denominators.init(spec.num_layers, spec.num_heads, toks.shape[1], options.num_blocks)}
    return sweep(steps[edits_fn], params, acc, toks, options.batch_size, f"intervention[{name}]", source,
                 args=(on, operand), progress=options.progress)

  def rows(acc: dict, on: FEDesign) -> dict:
    return _leakage_rows(acc, on, options.early_max, options.num_blocks)

  baseline_rows = None  # the main pass's rows, which every intervention without a reference pass shares
  out: dict = {"bos_replace": {}}
  for iv in registry(model.embed[...], main, others[0] if others else None, visible, baseline["sinks"], options):
    after = measured(iv.name, iv.edits, iv.operand, iv.design or design)
    if iv.reference is not None:
      before = rows(measured(iv.name + ".reference", iv.edits, iv.reference_operand, iv.reference)["leakage"],
                    iv.reference)
    else:
      if baseline_rows is None:
        baseline_rows = rows(baseline["acc"]["leakage"], design)
      before = baseline_rows
    ci = intervals.summarize(_effect(before, rows(after["leakage"], iv.design or design)),
                             baseline["acc"]["leakage"]["n"])
    entry = {**_effect_entry(ci), "sink_mass_after": _sink_mass_after(after["denominators"], visible,
                                                                      options.sink_min_query), **iv.info}
    group, _, kind = iv.name.partition(".")
    if kind:
      out.setdefault(group, {})[kind] = entry
    else:
      out[group] = entry
  if main == "prepend":
    out["bos_replace"]["token_id"] = int(options.bos_replace_token)
  else:
    out["bos_replace"]["skipped"] = (f"bos_replace replaces the BOS embedding at position 0; under the main policy "
                                     f"{main!r} position 0 holds a text token, so it does not run")
  return out
