"""The analysis API: ``analyze(model, sequences) -> AnalysisResult``.

Two sweeps over the sequences. The baseline sweep runs
:func:`steps.make_baseline_step` on the main BOS policy's sequences
(``prepend``: position 0 is BOS; ``none``: position 0 is a text token) and
:func:`steps.make_position0_step` on the other's (its fingerprint of
``x_0``, loss and closedness: nothing else of it is reported). The
intervention sweep (:mod:`estimators.effects`) reruns the main policy's
sequences with each intervention and measures its change of each leakage
component. Each estimator module writes its own part of summary.json and
stats.npz (``summarize(fin, ci)``, ``arrays(fin, ci)``, iterated over
``core.CORE`` and the probes; the shared keys are in :mod:`schema`).
Everything is a sum accumulated batch by batch on the device; ``finalize``
turns the sums into results (:mod:`abspos_jax.analysis.core`).
"""

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax.analysis import core
from abspos_jax.analysis.estimators import effects, fixed_effects, intervals, position0
from abspos_jax.analysis.estimators.fixed_effects import FEDesign
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.outputs import schema
from abspos_jax.analysis.passes import memory
from abspos_jax.analysis.passes.steps import (CompiledStep, Statistic, init_accumulators, init_position0_pass,
                                              make_baseline_step, make_position0_step, sweep)
from abspos_jax.config import BOS_POLICIES
from abspos_jax.model import Decoder, ModelSpec


@dataclasses.dataclass
class AnalysisResult:
  """``summary``: JSON-ready scalars and per-layer lists; ``stats``: named arrays; ``user``: user statistics."""

  summary: dict
  stats: dict[str, np.ndarray]
  user: dict[str, dict[str, np.ndarray]]


def _check_inputs(spec: ModelSpec, sequences: Mapping[str, np.ndarray], main: str) -> None:
  if main not in sequences:
    raise ValueError(f"sequences must hold the main policy {main!r}; got {sorted(sequences)}")
  for name, toks in sequences.items():
    if name not in BOS_POLICIES:
      raise ValueError(f"sequences keys must be among {BOS_POLICIES}, got {name!r}")
    if toks.ndim != 2 or len(toks) < 2:
      raise ValueError(f"sequences[{name!r}] must be [N >= 2, T], got shape {toks.shape}")
  seq_len = sequences[main].shape[1]
  if spec.position == "learned" and seq_len > spec.max_len:
    raise ValueError(f"sequences of {seq_len} tokens exceed the {spec.max_len} learned positions")


def _passes(model: Decoder, sequences: Mapping[str, np.ndarray], main: str, statistics: dict[str, Statistic],
            visible: jax.Array, design: FEDesign, options: AnalysisOptions) -> tuple[dict, AnalysisOptions, dict]:
  """The baseline pass over ``main``'s sequences and the position-0 pass over each other policy's.

  The other policies go first, while the main pass's accumulators (the
  largest arrays held) do not exist yet; each step's program, which keeps its
  scratch memory, is dropped after its sweep, and the heap's free pages go
  back to the OS after each phase (:func:`memory.release_free_pages`).

  Returns ``(finals, options, memory)``: per policy its finalized results with
  the accumulators under ``"acc"``; the options with the batch size that fits
  the memory budget; summary.json's ``memory`` entry.
  """
  spec, seq_len = model.spec, sequences[main].shape[1]
  graphdef, params = nnx.split(model, nnx.Param)
  num_groups, x0_groups = core.fingerprint_groups(sequences, spec.vocab_size)
  baseline_steps = {}  # per query block: the memory budget may compile several, the sweep runs one

  def baseline_step(block: int) -> CompiledStep:
    if block not in baseline_steps:
      baseline_steps[block] = CompiledStep(make_baseline_step(
          graphdef, design, statistics, jnp.asarray(x0_groups), options.closedness_sequences,
          query_block=None if block == seq_len else block))
    return baseline_steps[block]

  init = functools.partial(init_accumulators, spec, seq_len, statistics, options.num_blocks, num_groups=num_groups)
  init_other = functools.partial(init_position0_pass, spec, num_groups)
  others = [p for p in sequences if p != main]
  held = _nbytes(jax.eval_shape(init)) + len(others) * _nbytes(jax.eval_shape(init_other))
  options, step_memory = _fit_batch_size(baseline_step, params, jax.eval_shape(init), sequences, options, held)
  baseline_step = baseline_step(options.query_block or seq_len)
  baseline_steps.clear()  # the budget's other blocks' programs
  other_finals = {}
  if others:
    position0_step = CompiledStep(make_position0_step(graphdef, jnp.asarray(x0_groups), options.closedness_sequences,
                                                      options.query_block))
    for policy in others:
      memory.release_free_pages()
      acc = sweep(position0_step, params, init_other(), sequences[policy], options.batch_size,
                  f"analysis[{policy}]", progress=options.progress)
      other_finals[policy] = {"position0": jax.jit(position0.finalize)(acc["position0"]), "acc": acc}
    # A compiled program keeps its scratch once it has run (0.55 GiB for the 12 x 768 model at 1,024 x 4).
    del position0_step
  memory.release_free_pages()
  acc = sweep(baseline_step, params, init(), sequences[main], options.batch_size, f"analysis[{main}]",
              progress=options.progress)
  del baseline_step
  memory.release_free_pages()
  finals = {main: {**core.finalize_baseline(acc, visible, design, options), "acc": acc}, **other_finals}
  return finals, options, step_memory


def _header(spec: ModelSpec, sequences: Mapping[str, np.ndarray], main: str, finals: dict, options: AnalysisOptions,
            step_memory: dict) -> dict:
  """summary.json's entries about the analysis itself: inputs, model, batch, memory, intervals, loss, closedness."""
  m = finals[main]
  return {
      "estimators": schema.ESTIMATORS,
      "main_policy": main, "num_sequences": int(len(sequences[main])), "seq_len": int(sequences[main].shape[1]),
      "position": spec.position, "num_layers": spec.num_layers, "num_heads": spec.num_heads,
      "batch_size": options.batch_size, "memory": step_memory,
      "intervals": {"method": "delete-one-block jackknife over sequence blocks (seq_id % num_blocks), t quantile",
                    "level": intervals.LEVEL, "num_blocks": options.num_blocks,
                    "nonempty_blocks": int((np.asarray(m["acc"]["leakage"]["n"]) > 0).sum())},
      "loss": {p: float(f["acc"]["loss_sum"] / f["acc"]["loss_count"]) for p, f in finals.items()},
      "closedness_max_abs_diff": float(max(float(jnp.max(f["acc"]["closedness"])) for f in finals.values())),
      "closedness_per_layer": schema.tolist(m["acc"]["closedness"]),
  }


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
  _check_inputs(model.spec, sequences, main)
  memory.release_free_pages()
  options = dataclasses.replace(options, num_blocks=intervals.blocks_for(len(sequences[main]), options.num_blocks))
  visible = core.layer_visible(model.spec, sequences[main].shape[1])
  design = fixed_effects.make_design(visible)
  finals, options, step_memory = _passes(model, sequences, main, statistics, visible, design, options)
  memory.release_free_pages()
  m = finals[main]
  ci = intervals.summarize(core.jackknife_baseline(m["acc"], visible, design, options, m),
                           m["acc"]["leakage"]["n"])
  estimates, arrays = core.summarize({**m, "probes": None}, ci)
  summary = {**_header(model.spec, sequences, main, finals, options, step_memory), **estimates,
             "fingerprint": position0.summarize_fingerprints({p: f["position0"] for p, f in finals.items()})}
  stats = {"tokens": np.asarray(sequences[main]), **arrays}
  for other in [p for p in sequences if p != main][:1]:
    stats["tokens_" + other] = np.asarray(sequences[other])
    stats["fingerprint_spread_" + other] = np.asarray(finals[other]["position0"]["fingerprint_spread"])
  if options.interventions:
    summary["interventions"] = effects.run(model, sequences, main, visible, m, options)
  user = {name: jax.device_get(stat.finalize(m["acc"]["user"][name])) for name, stat in statistics.items()}
  return AnalysisResult(summary=summary, stats=stats, user=user)


def _nbytes(tree: Any) -> int:
  """Bytes of the arrays (or ``ShapeDtypeStruct`` s) of ``tree``."""
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _fit_batch_size(step_for, params, acc, sequences: Mapping[str, np.ndarray],
                    options: AnalysisOptions, held: int) -> tuple[AnalysisOptions, dict]:
  """``options`` with the largest batch size (up to ``options.batch_size``) whose baseline step fits the budget,
  and the attention's query block (``query_block``: None for all ``T`` at once).

  The budget is ``memory_budget_gb`` or half of what is free now
  (:func:`memory.available_bytes`) once the accumulators the analysis will
  hold (``held`` bytes, not allocated yet) are taken out: for a 1B model at
  2,048 tokens they are gigabytes (the residual probe's blocked Gram
  matrices). The batch is also capped at :func:`memory.logits_batch_cap`
  (one block's logits within 256 MiB: larger batches are slower on the CPU),
  in blocks of queries at :func:`memory.blocked_batch_cap` (1,024 tokens per
  step), and, where that costs at most half of it, cut to equal batches
  (:func:`memory.even_batch`).
  Where one sequence's layer of logits passes that cap or the budget, the
  attention runs in blocks of queries (:func:`memory.choose_batch_and_block`;
  ``options.query_block`` fixes the block). ``step_for(block)`` is the
  baseline step at that block; its compiled programs are the ones the sweep
  then runs (:class:`steps.CompiledStep`). Returns the options and the
  summary's ``memory`` entry.
  """
  free = memory.available_bytes() - held
  if options.memory_budget_gb is None and free <= 0:
    raise ValueError(f"the analysis accumulators alone need {held / memory.GiB:.2f} GiB and "
                     f"{memory.available_bytes() / memory.GiB:.2f} GiB are free; analyse shorter sequences "
                     f"(--seq_len) or use fewer num_blocks")
  budget = free // 2 if options.memory_budget_gb is None else int(options.memory_budget_gb * memory.GiB)
  seq_len = next(iter(sequences.values())).shape[1]

  def compile_for(b: int, block: int):
    return step_for(block).compiled(params, acc, jax.ShapeDtypeStruct((b, seq_len), jnp.int32),
                                    jax.ShapeDtypeStruct((b,), jnp.int32))

  num_sequences = max(len(t) for t in sequences.values())
  batch, block, used = memory.choose_batch_and_block(
      compile_for, min(options.batch_size, num_sequences), budget, memory.query_blocks(seq_len, options.query_block),
      acc["leakage"]["lz"].shape[2], seq_len, what=f"the analysis step at {seq_len} tokens",
      num_sequences=num_sequences)
  return dataclasses.replace(options, batch_size=batch, query_block=None if block == seq_len else block), {
      "budget_gib": budget / memory.GiB, "step_gib": used / memory.GiB, "query_block": block,
      "accumulators_gib": held / memory.GiB,
      "budget_rule": ("memory_budget_gb" if options.memory_budget_gb is not None
                      else "half the memory free at the start, less the accumulators"),
      "step_rule": "the compiled baseline step's scratch + outputs - donated buffers (XLA memory analysis)"}
