"""Optimizer: AdamW with linear warmup, cosine decay and global-norm clipping.

Weight decay applies to matrices only (``ndim >= 2``: projections and
embeddings), never to RMSNorm scales or the optional q/k/v biases.
"""

import jax
import ml_collections
import optax


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """0 -> ``learning_rate`` over ``warmup_steps``, cosine down to ``learning_rate * end_lr_fraction`` at ``steps``."""
  warmup = min(train.warmup_steps, train.steps - 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate, warmup_steps=warmup,
      decay_steps=max(train.steps, warmup + 1), end_value=train.learning_rate * train.end_lr_fraction)


BIASES = ("bq", "bk", "bv")  # [heads, head_dim]: two axes, but biases all the same


def decay_mask(params):
  def decays(path, p) -> bool:
    names = {getattr(k, "key", None) for k in path}
    return p.ndim >= 2 and not names & set(BIASES)
  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip),
      optax.adamw(learning_rate_schedule(train), b1=train.beta1, b2=train.beta2,
                  weight_decay=train.weight_decay, mask=decay_mask),
  )
