"""Multi-head attention, written once.

One code path computes the logits ``s_ij = q_i . k_j / sqrt(d_h)`` (after RoPE
when the model uses it), applies the single mask function of
:mod:`abspos_jax.masks`, and normalises with a numerically safe softmax that
also returns ``log Z_i``. The analysis reads logits, weights and ``log Z`` from
this same path through hook points. Training may instead take the fused
``jax.nn.dot_product_attention`` path (``model.attention_impl = "fused"``),
which computes the same function.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from abspos_jax import masks
from abspos_jax.hooks import Hooks
from abspos_jax.layers import param
from abspos_jax.rope import apply_rope


def attention_logits(q: jax.Array, k: jax.Array) -> jax.Array:
  """``s [B, H, Tq, Tk] = q . k / sqrt(d_h)`` in float32 from ``q [B, Tq, H, d_h]``, ``k [B, Tk, H, d_h]``."""
  s = jnp.einsum("bthk,bshk->bhts", q, k, preferred_element_type=jnp.float32)
  return s * (q.shape[-1] ** -0.5)


def masked_softmax(logits: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Softmax over visible keys.

  Args:
    logits: ``[..., Tq, Tk]``.
    mask: bool, broadcastable to ``logits``; every query must see at least one key.

  Returns:
    ``(masked_logits, weights, log_z)``: logits with ``-inf`` on masked cells,
    ``a_ij = exp(s_ij - log Z_i)`` (exactly 0 on masked cells) and
    ``log Z_i = logsumexp_{j in V(i)} s_ij`` of shape ``[..., Tq]``.
  """
  s = jnp.where(mask, logits, -jnp.inf)
  log_z = jax.nn.logsumexp(s, axis=-1)
  return s, jnp.exp(s - log_z[..., None]), log_z


class Attention(nnx.Module):
  """Multi-head self-attention with RoPE (optional) and an optional sliding window."""

  def __init__(
      self,
      d_model: int,
      num_heads: int,
      *,
      window: int | None,
      rope_base: float | None,
      impl: str,
      std: float,
      out_std: float,
      param_dtype,
      dtype,
      rngs: nnx.Rngs,
  ):
    head_dim = d_model // num_heads
    self.wq = param(rngs, (d_model, num_heads, head_dim), ("embed", "heads", "head_dim"), std, param_dtype)
    self.wk = param(rngs, (d_model, num_heads, head_dim), ("embed", "heads", "head_dim"), std, param_dtype)
    self.wv = param(rngs, (d_model, num_heads, head_dim), ("embed", "heads", "head_dim"), std, param_dtype)
    self.wo = param(rngs, (num_heads, head_dim, d_model), ("heads", "head_dim", "embed"), out_std, param_dtype)
    self.window = window
    self.rope_base = rope_base
    self.impl = impl
    self.dtype = dtype

  def __call__(self, x: jax.Array, positions: jax.Array, *, hooks: Hooks | None = None, name: str = "attn") -> jax.Array:
    """``x [B, T, D]``, ``positions [T]`` -> ``[B, T, D]``."""
    x = x.astype(self.dtype)
    q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(self.dtype))
    k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(self.dtype))
    v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(self.dtype))
    if self.rope_base is not None:
      q = apply_rope(q, positions, self.rope_base)
      k = apply_rope(k, positions, self.rope_base)
    if hooks is None and self.impl == "fused":
      local = None if self.window is None else (self.window - 1, 0)
      out = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local)
    else:
      mask = masks.visible(positions, positions, self.window)
      s, a, log_z = masked_softmax(attention_logits(q, k), mask)
      if hooks is not None:
        edited = hooks(f"{name}.logits", s)
        if edited is not s:  # an intervention changed the logits: renormalise
          s, a, log_z = masked_softmax(edited, mask)
        log_z = hooks(f"{name}.log_z", log_z)
        a = hooks(f"{name}.weights", a)
      out = jnp.einsum("bhts,bshk->bthk", a.astype(self.dtype), v)
    return jnp.einsum("bthk,hkd->btd", out, self.wo[...].astype(self.dtype))
