"""The attention mask: one function of (query, key) positions.

Causal attention lets query ``i`` see keys ``V(i) = {j <= i}``. A sliding window
of ``W`` keys, the query included, gives ``V(i) = {i - W < j <= i}`` (the
Mistral / maxtext / levanter convention), so ``|V(i)| = min(i + 1, W)``.
"""

import jax
import jax.numpy as jnp


def visible(query_pos: jax.Array, key_pos: jax.Array, window: int | None = None) -> jax.Array:
  """Boolean mask ``[..., Tq, Tk]``: True where key ``j`` is visible to query ``i``.

  ``query_pos [..., Tq]`` and ``key_pos [..., Tk]`` are absolute positions.
  ``window=None`` is plain causal attention.
  """
  q = jnp.asarray(query_pos)[..., :, None]  # NumPy positions: built in the graph, not a [T, T] constant
  k = jnp.asarray(key_pos)[..., None, :]
  mask = k <= q
  if window is not None:
    mask = mask & (q - k < window)
  return mask


def causal_mask(seq_len: int, window: int | None = None) -> jax.Array:
  """``visible`` for positions ``0 .. T-1``: ``[T, T]``."""
  pos = jnp.arange(seq_len)
  return visible(pos, pos, window)


def num_visible(query_pos: jax.Array, window: int | None = None) -> jax.Array:
  """``|V(i)| = i + 1`` (causal) or ``min(i + 1, W)`` (window): same shape as ``query_pos``."""
  n = query_pos + 1
  return n if window is None else jnp.minimum(n, window)
