"""The core estimators' results from their accumulators, and their jackknife: what :func:`analyze` and the
training-time emergence hook (:mod:`abspos_jax.analysis.emergence`) share.

The core is the part of the baseline pass every analysis runs: denominators,
leakage and its components, position 0, sinks (``steps.init_core``). Its
numbers with intervals are ``finalize_core`` evaluated once on all sequence
blocks and once per deleted block (:mod:`estimators.intervals`).
"""

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax import masks
from abspos_jax.analysis.estimators import denominators, intervals, leakage, position0, probes, sinks
from abspos_jax.analysis.estimators.fixed_effects import FEDesign
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.model import ModelSpec


def layer_visible(spec: ModelSpec, seq_len: int) -> jax.Array:
  """``[T, T]`` when every layer has the same mask, else ``[L, T, T]``."""
  windows = spec.layer_windows()
  if len(set(windows)) == 1:
    return masks.causal_mask(seq_len, windows[0])
  return jnp.stack([masks.causal_mask(seq_len, w) for w in windows])


def fingerprint_groups(sequences: Mapping[str, np.ndarray], vocab_size: int) -> tuple[int, np.ndarray]:
  """One fingerprint group per first token that occurs: ``(num_groups, x0_groups int [vocab_size])``."""
  first_tokens = np.unique(np.concatenate([np.asarray(t)[:, 0] for t in sequences.values()]))
  x0_groups = np.zeros(vocab_size, np.int32)
  x0_groups[first_tokens] = np.arange(len(first_tokens))
  return len(first_tokens), x0_groups


@dataclasses.dataclass(frozen=True)
class Estimator:
  """One estimator of the core, as :func:`analyze`, the jackknife and the emergence hook iterate it.

  ``name``: its key in the results and the jackknife (``<name>.<key>``).
  ``module``: where its math lives, with ``summarize(fin, ci) -> summary.json
  entries``, ``arrays(fin, ci) -> stats.npz entries`` and ``INTERVAL_KEYS``
  (the results that carry a jackknife interval). ``finalize(acc, done,
  visible, design, options, keep)``: its results from the core accumulators
  ``acc`` over the kept blocks (``done``: the results of the estimators before
  it), jittable.
  """
  name: str
  module: ModuleType
  finalize: Callable[..., dict[str, jax.Array]]


# The core, in order (sinks reads the denominators' half-sample sink mass).
CORE = (
    Estimator("denominators", denominators, lambda acc, done, visible, design, options, keep:
              denominators.finalize(acc["denominators"], visible, keep)),
    Estimator("leakage", leakage, lambda acc, done, visible, design, options, keep:
              leakage.finalize(acc["leakage"], design, keep, early_max=options.early_max)),
    Estimator("position0", position0, lambda acc, done, visible, design, options, keep:
              position0.finalize(acc["position0"])),
    Estimator("sinks", sinks, lambda acc, done, visible, design, options, keep:
              sinks.sink_statistics(done["denominators"]["sink_mass_half"], visible, min_query=options.sink_min_query,
                                    epsilon=options.sink_epsilon)),
)


def finalize_core(acc: dict, visible: jax.Array, design: FEDesign,
                  options: AnalysisOptions = AnalysisOptions(), keep: jax.Array | None = None
                  ) -> dict[str, dict[str, jax.Array]]:
  """Results of the core accumulators (``steps.init_core``) over the kept blocks, ``{name: results}`` for each
  estimator of :data:`CORE`; jittable."""
  done: dict[str, dict[str, jax.Array]] = {}
  for e in CORE:
    done[e.name] = e.finalize(acc, done, visible, design, options, keep)
  return done


def summarize(finals: Mapping[str, dict], ci: dict) -> tuple[dict, dict[str, np.ndarray]]:
  """``(summary.json entries, stats.npz arrays)`` of the core and the probes, each estimator's own
  ``summarize`` and ``arrays`` over its results in ``finals`` and the jackknife summary ``ci``."""
  summary, arrays = {}, {}
  for name, module in [(e.name, e.module) for e in CORE] + [("probes", probes)]:
    summary.update(module.summarize(finals.get(name), ci))
    arrays.update(module.arrays(finals.get(name), ci))
  return summary, arrays


def _core_kept(keep: jax.Array, acc: dict, visible: jax.Array, design: FEDesign, *,
               options: AnalysisOptions) -> dict:
  """:func:`finalize_core` with ``keep`` first, as :func:`intervals.evaluate` calls it (module level: its
  program is compiled once per shape)."""
  return finalize_core(acc, visible, design, options, keep)


def _probe_kept(keep: jax.Array, acc: dict, *, ridge: float) -> dict:
  return probes.finalize(acc, keep, ridge=ridge)


def finalize_baseline(acc: dict, visible: jax.Array, design: FEDesign, options: AnalysisOptions) -> dict:
  """The core's results (``{name: results}`` of :func:`finalize_core`) and each probe's, over all blocks.

  Each is one program, run to the end before the next (two batched LU solves
  at once can deadlock XLA CPU's intra-op pool: ``probes.finalize``), and the
  one :func:`jackknife_baseline` then runs per deleted block.
  """
  out = dict(intervals.all_blocks(_core_kept, options.num_blocks, acc, visible, design, options=options))
  for name in probes.PROBES:
    out[name] = intervals.all_blocks(_probe_kept, options.num_blocks, acc[name], ridge=options.probe_ridge)
  return out


def jackknife_baseline(acc: dict, visible: jax.Array, design: FEDesign, options: AnalysisOptions,
                       finals: Mapping[str, dict]) -> dict:
  """The core numbers' and the probes' values over all blocks (from ``finals``, :func:`finalize_baseline`'s)
  and with each block left out, by the same programs, one at a time."""
  keys = lambda fin: {f"{e.name}.{k}": fin[e.name][k] for e in CORE for k in e.module.INTERVAL_KEYS}  # noqa: E731
  out = dict(intervals.evaluate(_core_kept, options.num_blocks, acc, visible, design, first=finals, pick=keys,
                                options=options))
  for name in probes.PROBES:
    out[f"{name}.r2"] = intervals.evaluate(_probe_kept, options.num_blocks, acc[name], first=finals[name],
                                           pick=lambda fin: fin["r2"], ridge=options.probe_ridge)
  return out


