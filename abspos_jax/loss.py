"""The language-modelling loss, shared by training (``train_step``) and the analysis (its held-out loss)."""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def lm_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean next-token cross entropy (nats): ``logits [B, T, V]``, ``targets [B, T]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()


def chunked_lm_loss(head: Callable[[jax.Array], jax.Array], h: jax.Array, targets: jax.Array,
                    chunk: int) -> jax.Array:
  """``lm_loss(head(h), targets)`` with the logits made ``chunk`` tokens at a time: ``h [B, T, D]``, ``targets
  [B, T]``, ``head: [B, C, D] -> [B, C, V]``.

  The peak holds ``[B, chunk, V]`` logits instead of ``[B, T, V]`` (at 16,384
  tokens, SmolLM2's 49,152-token vocabulary makes that 3.2 GB per sequence in
  float32, more than the blocked attention). ``T`` is padded up to a multiple
  of ``chunk`` and the padding is left out of the mean. Equal to ``lm_loss``
  up to float32 summation order; ``T <= chunk`` is ``lm_loss`` itself.

  Under differentiation each chunk is rematerialised (``jax.checkpoint``):
  the backward recomputes one chunk's logits at a time instead of keeping
  all of them, so training holds ``[B, chunk, V]`` too.
  """
  b, t = targets.shape
  if t <= chunk:
    return lm_loss(head(h), targets)
  n = -(-t // chunk)
  pad = n * chunk - t
  hs = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, h.shape[-1]).swapaxes(0, 1)
  ts = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
  valid = (jnp.arange(n * chunk) < t).reshape(n, chunk)

  @jax.checkpoint
  def one(args):
    hc, tc, vc = args
    ce = optax.softmax_cross_entropy_with_integer_labels(head(hc).astype(jnp.float32), tc)
    return jnp.where(vc[None], ce, 0.0).sum()

  return jax.lax.map(one, (hs, ts, valid)).sum() / (b * t)
