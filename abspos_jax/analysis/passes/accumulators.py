"""Per-layer views of the blocked accumulators, for folding one layer at a time.

:mod:`leakage` and :mod:`denominators` keep the same layout: sums
``[K, L, ...]`` (sequence block, layer, ...), references ``ref [L, ...]`` and
the sequence count ``n [K]``. The analysis pass folds each layer's
``[B, H, T, T]`` logits into its slice as soon as the layer has run
(``steps.forward_folding``), so at most one layer's logits are alive;
``n`` is added once per batch, after the last layer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from abspos_jax.analysis.estimators.fixed_effects import FEDesign


def _axis(path: tuple) -> int | None:
  """The layer axis of an accumulator leaf, from its key: None for ``n``, 0 for ``ref``, else 1."""
  key = path[-1].key
  return None if key == "n" else 0 if key == "ref" else 1


def view(acc: Any, layer: int) -> Any:
  """``acc`` restricted to ``layer`` (kept as a length-1 axis); ``n`` as it is."""
  def one(path, x):
    axis = _axis(path)
    return x if axis is None else jax.lax.slice_in_dim(x, layer, layer + 1, axis=axis)

  return jax.tree_util.tree_map_with_path(one, acc)


def write(acc: Any, layer: int, part: Any) -> Any:
  """``acc`` with ``layer``'s slice replaced by ``part`` (from :func:`view`); ``n`` kept from ``acc``."""
  def one(path, x, y):
    axis = _axis(path)
    return x if axis is None else jax.lax.dynamic_update_slice_in_dim(x, y, layer, axis=axis)

  return jax.tree_util.tree_map_with_path(one, acc, part)


def design(d: FEDesign, layer: int) -> FEDesign:
  """The design of one layer: ``d`` itself for a mask shared by all layers, else its ``[layer:layer+1]``."""
  if d.query_count.ndim == 1:
    return d
  return FEDesign(*(x[layer:layer + 1] for x in d))


def count(acc: dict, seq_ids: jax.Array) -> dict:
  """``acc`` with the batch's sequences (``seq_ids [B]``) counted in their blocks."""
  num_blocks = acc["n"].shape[0]
  return {**acc, "n": acc["n"] + jax.nn.one_hot(seq_ids % num_blocks, num_blocks, dtype=jnp.float32).sum(0)}
