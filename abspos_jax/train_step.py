"""The train step and the eval step: pure functions of (params, optimizer state, tokens).

``tokens [B, T + 1]``: the model reads ``tokens[:, :-1]`` and predicts
``tokens[:, 1:]``. With ``grad_accum = A`` the batch is cut into ``A``
micro-batches whose gradients are averaged (a ``lax.scan``, so memory is that
of one micro-batch) before one optimizer update.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from abspos_jax.loss import chunked_lm_loss, lm_loss


def make_loss_fn(graphdef: nnx.GraphDef, loss_chunk: int = 0) -> Callable[[nnx.State, jax.Array], jax.Array]:
  """``loss(params, tokens [B, T + 1])``: mean next-token cross entropy. ``loss_chunk > 0`` applies the
  output head that many tokens at a time (``loss.chunked_lm_loss``: the same loss, and the same gradient,
  without the ``[B, T, V]`` logits)."""
  def loss_fn(params: nnx.State, tokens: jax.Array) -> jax.Array:
    model = nnx.merge(graphdef, params)
    if loss_chunk:
      return chunked_lm_loss(model.logits, model.features(tokens[:, :-1]), tokens[:, 1:], loss_chunk)
    return lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
  return loss_fn


def make_train_step(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, grad_accum: int = 1,
                    loss_chunk: int = 0):
  """``step(params, opt_state, tokens) -> (params, opt_state, {"loss", "grad_norm", "finite"})``.

  When the loss or the gradient norm is not finite, params and optimizer state
  come back unchanged and ``finite`` is False. ``loss_chunk``: see :func:`make_loss_fn`.
  """
  grad_fn = jax.value_and_grad(make_loss_fn(graphdef, loss_chunk))

  def step(params, opt_state, tokens):
    if grad_accum == 1:
      loss, grads = grad_fn(params, tokens)
    else:
      micro = tokens.reshape(grad_accum, tokens.shape[0] // grad_accum, *tokens.shape[1:])

      def body(carry, mb):
        loss, grads = grad_fn(params, mb)
        return jax.tree.map(jnp.add, carry, (loss, grads)), None

      zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params))
      (loss, grads), _ = jax.lax.scan(body, zeros, micro)
      loss, grads = jax.tree.map(lambda x: x / grad_accum, (loss, grads))
    grad_norm = optax.global_norm(grads)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # A non-finite loss or gradient never reaches the weights: the step is a no-op
    # and the loop decides (train.nonfinite) whether to stop or go on.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    return keep(new_params, params), keep(new_opt_state, opt_state), {
        "loss": loss, "grad_norm": grad_norm, "finite": finite}

  return step


def make_eval_step(graphdef: nnx.GraphDef, loss_chunk: int = 0):
  """``eval_step(params, tokens) -> mean loss`` over the batch."""
  return make_loss_fn(graphdef, loss_chunk)
