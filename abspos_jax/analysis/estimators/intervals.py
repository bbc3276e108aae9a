"""Delete-one-block jackknife intervals from blocked accumulators.

Every accumulator of the analysis is a sum over sequences kept per block
(``seq_id % K``). A statistic ``theta = f(acc, keep)`` is computed from the
kept blocks (``keep [K]`` in {0, 1}); the jackknife recomputes it with each
non-empty block left out in turn (``theta_(k)``), with no second pass over the
data. With ``g`` non-empty blocks and ``theta_bar`` the mean of the
``theta_(k)``::

    se^2 = (g - 1) / g * sum_k (theta_(k) - theta_bar)^2
    interval = theta +- t_{g-1, 0.975} * se

The interval is NaN where any ``theta_(k)`` is not finite (e.g. leaving out a
block empties a half) or ``g < 2``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

LEVEL = 0.95


def _t_quantile(p: float, df):
  """Student's t quantile ``scipy.stats.t.ppf(p, df)``, which is ``scipy.special.stdtrit(df, p)``: training
  imports this module (the emergence hook), and importing scipy.stats would cost most of a second of every
  process's start."""
  return scipy.special.stdtrit(df, p)


def blocks_for(num_sequences: int, num_blocks: int) -> int:
  """The blocks an analysis of ``num_sequences`` allocates: ``num_blocks``, or the least even number
  ``>= num_sequences`` when that is fewer. Sequence ``i < num_sequences`` falls in block ``i % K`` either way,
  so the halves, the non-empty blocks and every interval are the same, while the accumulators and the
  ``K + 1`` jackknife evaluations shrink with ``K`` (4 sequences: 4 blocks where 16 would leave 12 empty)."""
  return min(num_blocks, num_sequences + num_sequences % 2)


def keep_masks(num_blocks: int) -> jax.Array:
  """``[K + 1, K]``: all blocks, then all but block ``k`` for each ``k``."""
  ones = jnp.ones((1, num_blocks), jnp.float32)
  return jnp.concatenate([ones, 1.0 - jnp.eye(num_blocks, dtype=jnp.float32)])


def evaluate(fn: Callable[..., Any], num_blocks: int, *args: Any, first: Any = None,
             pick: Callable[[Any], Any] = lambda x: x, **static: Any) -> Any:
  """``pick(fn(keep, *args, **static))`` for every row of :func:`keep_masks`, stacked on a leading axis.

  ``first``: ``fn``'s value with every block kept, when the caller has it
  already (:func:`all_blocks`): the rows then start at the first deleted
  block, so the finalisation with all blocks runs once, and compiles once.

  ``fn`` is jitted once and called once per keep from a Python loop, each
  call finished before the next starts, so the ``K + 1`` evaluations hold one
  set of intermediates at a time (the probes' ``[L+1, D+1, D+1]`` systems are
  gigabytes at d_model 2,048). Not a ``vmap`` or ``lax.map`` inside one
  program: on XLA CPU (jax 0.10) both forms deadlocked now and then (every
  worker thread idle while the result never became ready; see
  docs/analysis.md, "Known issue"). Pass the arrays ``fn`` reads as ``args``
  rather than closing over them, so they are not baked into the program as
  constants, and Python values as ``static`` keywords: a module-level ``fn``
  then compiles once per shape of ``args``, however often it is evaluated.
  """
  jitted = jax.jit(fn, static_argnames=tuple(static))
  masks = keep_masks(num_blocks)
  rows = [] if first is None else [pick(first)]
  rows += [pick(jax.block_until_ready(jitted(keep, *args, **static))) for keep in masks[len(rows):]]
  return jax.tree.map(lambda *x: jnp.stack(x), *rows)


def all_blocks(fn: Callable[..., Any], num_blocks: int, *args: Any, **static: Any) -> Any:
  """``fn(keep, *args, **static)`` with every block kept, by the program :func:`evaluate` then reuses (pass
  the value as its ``first``)."""
  return jax.block_until_ready(jax.jit(fn, static_argnames=tuple(static))(keep_masks(num_blocks)[0], *args,
                                                                             **static))


def summarize(stacked: Any, block_counts: np.ndarray, level: float = LEVEL) -> dict[str, Any]:
  """``{"value", "se", "lo", "hi"}`` pytrees from :func:`evaluate`'s output (on the host).

  ``block_counts [K]``: sequences per block; empty blocks are not left out.
  """
  present = np.asarray(block_counts) > 0
  g = int(present.sum())
  t = float(_t_quantile(0.5 + level / 2, g - 1)) if g >= 2 else np.nan

  def one(x):
    x = np.asarray(x, np.float64)
    value, loo = x[0], x[1:][present]
    if g < 2:
      se = np.full_like(value, np.nan)
    else:
      with np.errstate(invalid="ignore", over="ignore"):
        dev = loo - loo.mean(0)
        se = np.sqrt((g - 1) / g * (dev * dev).sum(0))
      se = np.where(np.isfinite(loo).all(0), se, np.nan)
    return value, se, value - t * se, value + t * se

  parts = jax.tree.map(one, jax.device_get(stacked))
  pick = lambda i: jax.tree.map(lambda p: p[i], parts, is_leaf=lambda p: isinstance(p, tuple))  # noqa: E731
  return {"value": pick(0), "se": pick(1), "lo": pick(2), "hi": pick(3)}


def excludes_zero(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
  """True where a finite interval lies entirely on one side of 0."""
  lo, hi = np.asarray(lo), np.asarray(hi)
  return np.isfinite(lo) & np.isfinite(hi) & ((lo > 0) | (hi < 0))


def seed_half_width(values: np.ndarray, level: float = LEVEL) -> np.ndarray:
  """Half-width of the t-interval of the mean over seeds: ``values [seeds, ...]`` (NaN = no value) -> ``[...]``.

  ``t_{n-1, (1 + level) / 2} * sd / sqrt(n)``, ``sd`` with ddof 1 over the
  ``n`` finite values; NaN where ``n < 2``.
  """
  a = np.asarray(values, np.float64)
  n = np.isfinite(a).sum(0)
  with np.errstate(invalid="ignore", divide="ignore"):
    mean = np.where(n > 0, np.nansum(a, 0) / np.maximum(n, 1), np.nan)
    var = np.nansum((a - mean) ** 2, 0) / np.maximum(n - 1, 1)
    t = _t_quantile(0.5 + level / 2, np.maximum(n - 1, 1))
    return np.where(n >= 2, t * np.sqrt(var / np.maximum(n, 1)), np.nan)
