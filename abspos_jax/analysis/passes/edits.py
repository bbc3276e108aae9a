"""Interventions: pure edits at hook points, traced into the same jitted forward.

Each function returns a ``{hook point: edit}`` mapping for
:class:`abspos_jax.hooks.Hooks`.

- ``bos_replace``: the token embedding at position 0 becomes the mean token
  embedding (``mean``), another token's embedding (``token``), zeros
  (``zeros``), or a random vector with the norm of the embedding it replaces
  (``random``, fixed seed).
- ``pos0_patch``: the position-0 residual stream at every layer (``resid.0`` to
  ``resid.L``) is taken from another forward pass.
- ``sink_ablate``: key 0 is removed from the chosen heads for every query
  ``i >= 1`` (its logit set to ``-inf``; the softmax renormalises over the
  remaining keys). Query 0 keeps key 0: it has no other key. It is measured
  on :func:`sink_cells`, the same cells before and after.
"""

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax import hooks as hooks_lib
from abspos_jax.hooks import Edit

BOS_REPLACEMENTS = ("mean", "token", "zeros", "random")


def replacement_vector(embed: jax.Array, kind: str, *, token: int, key: jax.Array | None = None) -> jax.Array:
  """The vector ``[D]`` (or a function of the replaced embedding, for ``random``) used by ``bos_replace``."""
  if kind == "mean":
    return embed.mean(0)
  if kind == "token":
    return embed[token]
  if kind == "zeros":
    return jnp.zeros(embed.shape[1], embed.dtype)
  if kind == "random":
    return jax.random.normal(jax.random.key(0) if key is None else key, (embed.shape[1],), embed.dtype)
  raise ValueError(f"bos_replace kind must be one of {', '.join(BOS_REPLACEMENTS)}, got {kind!r}")


def bos_replacement(embed: jax.Array, kind: str, *, token: int = 10) -> dict[str, jax.Array]:
  """What :func:`bos_replace` puts at position 0 for ``kind``: ``vector [D]`` and ``rescale`` (a bool scalar,
  True for ``random``: the vector is scaled to the norm of the embedding it replaces). Arrays, so that every kind
  runs in one compiled pass."""
  return {"vector": replacement_vector(embed, kind, token=token), "rescale": jnp.asarray(kind == "random")}


def bos_replace(replacement: dict[str, jax.Array]) -> dict[str, Edit]:
  """Replace the token embedding at position 0 by ``replacement`` (:func:`bos_replacement`)."""
  vec, rescale = replacement["vector"], replacement["rescale"]

  def edit(e: jax.Array) -> jax.Array:  # e [B, T, D]
    new = jnp.broadcast_to(vec.astype(e.dtype), e[:, 0].shape)
    scaled = new * (jnp.linalg.norm(e[:, 0], axis=-1, keepdims=True) / jnp.linalg.norm(vec))
    return e.at[:, 0].set(jnp.where(rescale, scaled, new))

  return {hooks_lib.EMBED_TOKENS: edit}


def pos0_patch(source: jax.Array) -> dict[str, Edit]:
  """Position 0's residual stream from ``source [L+1, B, D]`` (resid.0 .. resid.L of another input)."""
  return {hooks_lib.resid(l): (lambda h, l=l: h.at[:, 0].set(source[l].astype(h.dtype)))
          for l in range(source.shape[0])}


def sink_ablate(heads: jax.Array) -> dict[str, Edit]:
  """Remove key 0 for queries ``i >= 1`` in the heads where ``heads [L, H]`` (bool) is True.

  Every layer gets the edit, so that ``heads`` can be a traced input (one
  compiled pass for any choice of heads); where it is False the logits pass
  through unchanged (``where(False, -inf, s) = s``). The queries ``i >= 1``
  are those that see another key than key 0 (each query sees itself), so
  the edit reads only each query's row of logits.
  """
  edits = {}
  for l in range(heads.shape[0]):
    def edit(s, l=l):  # s [B, H, R, W]: a block of queries over keys 0 .. W - 1 (hooks.Hooks.query_block)
      # A query i >= 1 is one that sees a key other than key 0 (itself): a test on its own row, so the edit
      # is the same on any block of queries.
      later = jnp.isfinite(s[..., 1:]).any(-1, keepdims=True)
      drop = jnp.asarray(heads[l])[None, :, None, None] & later & (jnp.arange(s.shape[-1]) == 0)
      return jnp.where(drop, -jnp.inf, s)

    edits[hooks_lib.attn(l, "logits")] = edit
  return edits


def sink_cells(visible: jax.Array, heads: np.ndarray) -> jax.Array:
  """``[L, H, T, T]``: the cells on which ``sink_ablate`` is measured, before and after.

  The model's mask (``visible [T, T]`` or ``[L, T, T]``) for heads that are not
  ablated; without key 0 for queries ``i >= 1`` in the ablated heads
  (``heads [L, H]``). Both passes then share, head by head, one cell set and so
  one mask-only normaliser (for an ablated head: ``n(i) = i`` keys, none of
  them key 0).
  """
  heads = np.asarray(heads, bool)
  t = visible.shape[-1]
  vis = jnp.broadcast_to(visible if visible.ndim == 3 else visible[None], (heads.shape[0], t, t))
  drop = (jnp.arange(t)[:, None] >= 1) & (jnp.arange(t)[None, :] == 0)
  return vis[:, None] & ~(jnp.asarray(heads)[:, :, None, None] & drop)
