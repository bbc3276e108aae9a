"""The language-modelling loss, shared by training (``train_step``) and the analysis (its held-out loss)."""

import jax
import jax.numpy as jnp
import optax


def lm_loss(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Mean next-token cross entropy (nats): ``logits [B, T, V]``, ``targets [B, T]``."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()
