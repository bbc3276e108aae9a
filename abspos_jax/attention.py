"""Multi-head attention, written once.

One code path computes the logits ``s_ij = q_i . k_j / sqrt(d_h)`` (after RoPE
when the model uses it), applies the single mask function of
:mod:`abspos_jax.masks`, and normalises with a numerically safe softmax that
also returns ``log Z_i``. The analysis reads logits, weights and ``log Z`` from
this same path through hook points. Training may instead take a fused
kernel (``model.attention_impl``: cuDNN, splash or ``jax.nn.dot_product_attention``,
see :mod:`abspos_jax.attention_kernels`), which computes the same function. Without hooks the explicit path runs through
:func:`softmax_attention`, whose backward is written by hand (the standard
attention gradient) rather than derived by autodiff through the mask and the
``logsumexp``: same forward, same gradient up to float rounding, fewer passes
over the ``[B, H, T, T]`` weights and less temporary memory (measured in
``docs/benchmarks.md``).

Grouped-query attention (``num_kv_heads`` dividing ``num_heads``): query head
``n`` reads key/value head ``n // G`` with ``G = num_heads / num_kv_heads``
(the Hugging Face ``repeat_kv`` order). Logits, weights and ``log Z`` are
still per *query* head, ``[B, H, T, T]``, so every hook and estimator sees the
same shapes with or without GQA.
"""

import functools
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import attention_kernels, masks, precision
from abspos_jax import hooks as hooks_lib
from abspos_jax.hooks import Hooks
from abspos_jax.layers import param
from abspos_jax.rope import apply_rope


def _grouped(q: jax.Array, num_kv_heads: int) -> jax.Array:
  """``q [B, T, H, d_h] -> [B, T, K, H/K, d_h]``: query head ``n`` in group ``n // (H/K)``."""
  b, t, h, d = q.shape
  if h % num_kv_heads:
    raise ValueError(f"{num_kv_heads} key/value heads do not divide {h} query heads")
  return q.reshape(b, t, num_kv_heads, h // num_kv_heads, d)


def attention_logits(q: jax.Array, k: jax.Array, dtype=jnp.float32) -> jax.Array:
  """``s [B, H, Tq, Tk] = q . k / sqrt(d_h)`` in float32 from ``q [B, Tq, H, d_h]``, ``k [B, Tk, K, d_h]``.

  ``K`` (key heads) divides ``H``; query head ``n`` is scored against key head ``n // (H/K)``.
  The product takes ``dtype`` inputs (:func:`precision.einsum`).
  """
  b, tq, h, d = q.shape
  s = precision.einsum("btkgd,bskd->bkgts", _grouped(q, k.shape[2]), k, dtype)
  return s.reshape(b, h, tq, k.shape[1]) * (d ** -0.5)


def attend(weights: jax.Array, v: jax.Array, dtype=jnp.float32) -> jax.Array:
  """``out [B, Tq, H, d_h] = sum_j a_ij v_j`` (float32) from ``weights [B, H, Tq, Tk]`` and ``v [B, Tk, K, d_h]``."""
  b, h, tq, tk = weights.shape
  kv = v.shape[2]
  a = weights.reshape(b, kv, h // kv, tq, tk)
  return precision.einsum("bkgts,bskd->btkgd", a, v, dtype).reshape(b, tq, h, v.shape[-1])


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


# Two query blocks skip a quarter of the [T, T] work; more blocks add more small products than they save
# (docs/benchmarks.md has the A/B of 1, 2 and 4 blocks).
QUERY_BLOCKS = 2


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, window: int | None,
                      dtype=jnp.float32) -> jax.Array:
  """``out [B, T, H, d_h] = sum_j a_ij v_j``, ``a = softmax_{j in V(i)}(q_i . k_j / sqrt(d_h))``.

  The explicit path of :meth:`Attention.__call__` (mask of
  :func:`masks.visible` over ``positions [T]``, ``q [B, T, H, d_h]``,
  ``k, v [B, T, K, d_h]``) as one differentiable function. Its backward keeps
  ``a`` from the forward and applies, with ``dO`` the output's cotangent and
  ``delta_i = sum_d dO_id out_id`` (``= sum_j a_ij dp_ij``)::

      dv_j = sum_i a_ij dO_i        dp_ij = dO_i . v_j
      ds_ij = a_ij (dp_ij - delta_i)
      dq_i = sum_j ds_ij k_j / sqrt(d_h)      dk_j = sum_i ds_ij q_i / sqrt(d_h)

  (summed over the query heads of a group for ``dk, dv`` under GQA). Masked
  cells have ``a_ij = 0`` and so no gradient, as under autodiff. Every product,
  forward and backward, takes ``dtype`` inputs and accumulates in float32; the
  softmax, ``delta`` and ``ds`` are computed in float32. What the backward
  keeps (``q, k, v, a, out``) is stored in ``dtype``: the products read it in
  ``dtype`` anyway, and in bfloat16 the ``[B, H, T, T]`` weights take half
  the bytes to write and read again; ``ds`` then carries ``a``'s bfloat16
  rounding, as the products already do.

  Block-causal: when ``positions`` is NumPy ``0 .. T-1`` (the model's, known
  at trace time) and ``T`` splits evenly, the queries are cut into
  :data:`QUERY_BLOCKS` blocks and block ``b`` is scored only against the
  keys up to its last query, so the key blocks every query of a block
  masks are never computed (a quarter of the ``[T, T]`` work at two
  blocks). Each block is the function above on its own keys; ``dk, dv``
  sum over the blocks.
  """
  f32 = lambda x: x.astype(jnp.float32)  # the backward returns float32 cotangents
  q, k, v, dtype = f32(q), f32(k), f32(v), jnp.dtype(dtype)
  t = q.shape[1]
  causal_order = isinstance(positions, np.ndarray) and np.array_equal(positions, np.arange(t))
  blocks = QUERY_BLOCKS if causal_order and t % QUERY_BLOCKS == 0 else 1
  size = t // blocks
  outs = [_softmax_attention(q[:, b * size:(b + 1) * size], k[:, :(b + 1) * size], v[:, :(b + 1) * size],
                             positions[b * size:(b + 1) * size], positions[:(b + 1) * size], window, dtype)
          for b in range(blocks)]
  return outs[0] if blocks == 1 else jnp.concatenate(outs, axis=1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _softmax_attention(q, k, v, query_pos, key_pos, window, dtype):
  return _softmax_attention_fwd(q, k, v, query_pos, key_pos, window, dtype)[0]


def _softmax_attention_fwd(q, k, v, query_pos, key_pos, window, dtype=jnp.float32):
  q, k, v = q.astype(dtype), k.astype(dtype), v.astype(dtype)
  _, a, _ = masked_softmax(attention_logits(q, k, dtype), masks.visible(query_pos, key_pos, window))
  a = a.astype(dtype)
  out = attend(a, v, dtype)
  return out, (q, k, v, a, out.astype(dtype))


def _softmax_attention_bwd(window, dtype, residuals, d_out):
  del window  # the mask is in the zeros of ``a``
  q, k, v, a, out = residuals
  b, t, h, d = q.shape
  kv = k.shape[2]
  mm = lambda eq, x, y: jnp.einsum(eq, x.astype(dtype), y.astype(dtype), preferred_element_type=jnp.float32)
  a = a.reshape(b, kv, h // kv, t, k.shape[1])
  do = _grouped(d_out.astype(jnp.float32), kv)
  dv = mm("bkgts,btkgd->bskd", a, do)
  dp = mm("btkgd,bskd->bkgts", do, v)
  delta = jnp.einsum("btkgd,btkgd->bkgt", do, _grouped(out.astype(jnp.float32), kv))
  ds = a.astype(jnp.float32) * (dp - delta[..., None]) * (d ** -0.5)
  dq = mm("bkgts,bskd->btkgd", ds, k).reshape(b, t, h, d)
  dk = mm("bkgts,btkgd->bskd", ds, _grouped(q, kv))
  return dq, dk, dv, None, None  # no gradient for positions


_softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)


class BlockFold(Protocol):
  """What :func:`query_block_attention` hands each block of queries to (the analysis' statistics)."""

  def begin(self, state: Any, first_blocks: Callable[[Callable, Any], Any]) -> Any:
    """``state`` before the first block. ``first_blocks(fn, init)`` runs the batch's first sequence through the
    same blocks (the same keys, after any edit) and returns ``fn``'s carry, ``fn(carry, start, logits [1, H, R, W],
    log_z [1, H, R], key_start)`` called once per block like :meth:`__call__`."""

  def __call__(self, state: Any, start: jax.Array, logits: jax.Array, log_z: jax.Array,
               key_start: int | jax.Array = 0) -> Any:
    """``state`` after the block of queries ``start .. start + R - 1``: ``logits [B, H, R, W]`` over keys
    ``key_start .. key_start + W - 1`` (after any edit, ``-inf`` off the mask; every key the block sees),
    ``log_z [B, H, R]``."""


# Blocks of queries are grouped into this many bands, each scored against the keys up to its last query:
# causal work ~ (1/4 + 2/4 + 3/4 + 1) / 4 = 0.625 of all T keys; more bands add programs to compile.
KEY_BANDS = 4


def key_bands(seq_len: int, block: int, positions: Any) -> list[tuple[int, int]]:
  """``[(first query, end)]`` per band of whole blocks of ``block`` queries: up to :data:`KEY_BANDS` bands of
  equally many blocks, whose queries see no key at or past ``end`` when ``positions`` is NumPy ``0 .. T-1``
  (the model's, known at trace time); one band of all ``T`` keys otherwise."""
  n = seq_len // block
  causal_order = isinstance(positions, np.ndarray) and np.array_equal(positions, np.arange(seq_len))
  bands = min(n, KEY_BANDS) if causal_order else 1
  edges = [block * (n * b // bands) for b in range(bands + 1)]
  return list(zip(edges[:-1], edges[1:]))


def window_span(seq_len: int, block: int, window: int | None, positions: Any) -> int | None:
  """Keys per block of ``block`` queries under a sliding window of ``window`` keys: ``block + window - 1``
  (the keys ``start - window + 1 .. start + block - 1``), when the model's positions are NumPy ``0 .. T-1``
  and that is fewer than ``T``; else None (the blocks take :func:`key_bands` from key 0)."""
  if window is None:
    return None
  causal_order = isinstance(positions, np.ndarray) and np.array_equal(positions, np.arange(seq_len))
  span = block + window - 1
  return span if causal_order and block < seq_len and span < seq_len else None


def query_block_attention(q: jax.Array, k: jax.Array, v: jax.Array, positions: jax.Array, window: int | None,
                          dtype, block: int, *, edit_logits: Callable[[jax.Array], jax.Array] = lambda s: s,
                          edit_weights: Callable[[jax.Array], jax.Array] = lambda a: a,
                          fold: BlockFold | None = None, state: Any = None,
                          edited: bool = True) -> tuple[jax.Array, jax.Array, Any]:
  """The explicit attention, ``block`` queries at a time: ``(out [B, T, H, d_h], log_z [B, H, T], state)``.

  Each block of queries ``R = block`` (``q [B, T, H, d_h]``, ``k, v [B, T, K, d_h]``)
  is scored against the keys ``0 .. W - 1`` of its band (:func:`key_bands`:
  ``W`` is the band's last query + 1, past which every key is masked;
  ``W = T`` for one band), ``s [B, H, R, W]``, masked by
  :func:`masks.visible`, passed to ``edit_logits`` (renormalised when it
  changes them), normalised by :func:`masked_softmax`, passed to
  ``edit_weights`` and applied to ``v``. A query's row is whole within its
  block (the keys left out are masked for it), so ``log Z``, the weights and
  the output are those of one block of all ``T`` queries to float rounding
  (no online rescaling: blocks are over queries only), and what is
  alive at once is ``O(B H R T)``, not ``O(B H T^2)``. ``fold`` sees each block's logits as it is computed
  (:class:`BlockFold`). Edits get the block's rows over its band's keys (column ``j`` is key ``j``) and must
  act on each query's row alone (as ``sink_ablate`` does). ``block`` divides ``T``. With ``edited=False`` (no
  edit of this layer) a windowed layer's blocks score only their :func:`window_span` keys (``_windowed_blocks``).
  """
  t = q.shape[1]
  if t % block:
    raise ValueError(f"the query block ({block}) must divide the sequence length ({t})")
  pos = jnp.asarray(positions)

  def rows(q_rows: jax.Array, k: jax.Array, start, key_start=0) -> tuple[jax.Array, jax.Array, jax.Array]:
    query_pos = jax.lax.dynamic_slice_in_dim(pos, start, q_rows.shape[1]) if block < t else pos
    mask = masks.visible(query_pos, jax.lax.dynamic_slice_in_dim(pos, key_start, k.shape[1]), window)
    s, a, log_z = masked_softmax(attention_logits(q_rows, k, dtype), mask)
    edited = edit_logits(s)
    if edited is not s:  # an intervention changed the logits: renormalise
      s, a, log_z = masked_softmax(edited, mask)
    return s, edit_weights(a), log_z

  span = None if edited else window_span(t, block, window, positions)

  def blocks(q, k, v, fold, state):
    if span is not None:
      return _windowed_blocks(q, k, v, rows, fold, state, block, window, span, dtype)
    return _banded_blocks(q, k, v, rows, fold, state, block, positions, dtype)

  if fold is not None:
    state = fold.begin(state, lambda fn, init: blocks(q[:1], k[:1], v[:1], fn, init)[2])
  return blocks(q, k, v, fold, state)


def _banded_blocks(q, k, v, rows, fold, state, block: int, positions, dtype):
  """:func:`query_block_attention`'s blocks, each against the keys ``0 .. W - 1`` of its band
  (:func:`key_bands`; one scan per band)."""
  b, t, h, _ = q.shape

  def band(state, first: int, end: int):
    kb, vb = k[:, :end], v[:, :end]

    def one(state, start):
      s, a, log_z = rows(jax.lax.dynamic_slice_in_dim(q, start, block, 1) if block < t else q, kb, start)
      if fold is not None:
        state = fold(state, start, s, log_z)
      return state, (attend(a, vb, dtype), log_z)

    if end - first == block:
      state, (out, log_z) = one(state, first)
      return state, out, log_z
    state, (out, log_z) = jax.lax.scan(one, state, jnp.arange(first, end, block))
    # [n, B, R, H, d_h] -> [B, n R, H, d_h]; [n, B, H, R] -> [B, H, n R]
    return (state, jnp.moveaxis(out, 0, 1).reshape(b, end - first, h, v.shape[-1]),
            jnp.moveaxis(log_z, 0, 2).reshape(b, h, end - first))

  parts = []
  for first, end in key_bands(t, block, positions):
    state, *part = band(state, first, end)
    parts.append(part)
  return jnp.concatenate([p[0] for p in parts], 1), jnp.concatenate([p[1] for p in parts], 2), state


def _windowed_blocks(q, k, v, rows, fold, state, block: int, window: int, span: int, dtype):
  """:func:`query_block_attention`'s blocks under a window, in one scan: each against its ``span`` keys from
  ``key_start = clip(start - window + 1, 0, T - span)``, the same rows in ``O(B H R (R + W))`` work instead of
  ``O(B H R T)``. The fold gets ``key_start``."""
  b, t, h, _ = q.shape

  def one(state, start):
    key_start = jnp.clip(start - window + 1, 0, t - span)
    kb, vb = (jax.lax.dynamic_slice_in_dim(x, key_start, span, 1) for x in (k, v))
    s, a, log_z = rows(jax.lax.dynamic_slice_in_dim(q, start, block, 1), kb, start, key_start)
    if fold is not None:
      state = fold(state, start, s, log_z, key_start)
    return state, (attend(a, vb, dtype), log_z)

  state, (out, log_z) = jax.lax.scan(one, state, jnp.arange(0, t, block))
  return (jnp.moveaxis(out, 0, 1).reshape(b, t, h, v.shape[-1]), jnp.moveaxis(log_z, 0, 2).reshape(b, h, t),
          state)


class Attention(nnx.Module):
  """Multi-head (or grouped-query) self-attention with RoPE (optional) and an optional sliding window.

  Parameters: ``wq [D, H, d_h]``, ``wk, wv [D, K, d_h]``, ``wo [H, d_h, D]``;
  with ``qkv_bias`` also ``bq [H, d_h]`` and ``bk, bv [K, d_h]`` (zeros at init),
  added before RoPE as in Qwen2.
  """

  def __init__(
      self,
      d_model: int,
      num_heads: int,
      *,
      num_kv_heads: int | None = None,
      qkv_bias: bool = False,
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
    kv = num_kv_heads or num_heads
    if num_heads % kv:
      raise ValueError(f"num_kv_heads={kv} must divide num_heads={num_heads}")
    self.wq = param(rngs, (d_model, num_heads, head_dim), ("embed", "heads", "head_dim"), std, param_dtype)
    self.wk = param(rngs, (d_model, kv, head_dim), ("embed", "kv_heads", "head_dim"), std, param_dtype)
    self.wv = param(rngs, (d_model, kv, head_dim), ("embed", "kv_heads", "head_dim"), std, param_dtype)
    self.wo = param(rngs, (num_heads, head_dim, d_model), ("heads", "head_dim", "embed"), out_std, param_dtype)
    if qkv_bias:
      self.bq = nnx.Param(jnp.zeros((num_heads, head_dim), param_dtype), logical_axes=("heads", "head_dim"))
      self.bk = nnx.Param(jnp.zeros((kv, head_dim), param_dtype), logical_axes=("kv_heads", "head_dim"))
      self.bv = nnx.Param(jnp.zeros((kv, head_dim), param_dtype), logical_axes=("kv_heads", "head_dim"))
    self.qkv_bias = qkv_bias
    self.window = window
    self.rope_base = rope_base
    self.impl = impl
    self.dtype = dtype

  def __call__(self, x: jax.Array, positions: jax.Array, *, hooks: Hooks | None = None, layer: int = 0) -> jax.Array:
    """``x [B, T, D]``, ``positions [T]`` -> ``[B, T, D]`` (float32; ``dtype`` is the matmul input dtype)."""
    # One product for q, k and v: a wider matmul runs nearer the CPU's peak than three narrow ones.
    w = jnp.concatenate([self.wq[...], self.wk[...], self.wv[...]], axis=1)
    q, k, v = jnp.split(precision.einsum("btd,dhk->bthk", x, w, self.dtype),
                        [self.wq.shape[1], self.wq.shape[1] + self.wk.shape[1]], axis=2)
    if self.qkv_bias:
      q = q + self.bq[...].astype(jnp.float32)
      k = k + self.bk[...].astype(jnp.float32)
      v = v + self.bv[...].astype(jnp.float32)
    if self.rope_base is not None:
      q = apply_rope(q, positions, self.rope_base)
      k = apply_rope(k, positions, self.rope_base)
    # With hooks the explicit path always runs: the analysis reads its logits, weights and log Z.
    kernel = "xla" if hooks is not None else attention_kernels.resolve(
        self.impl, dtype=self.dtype, head_dim=q.shape[-1], seq_len=q.shape[1])
    if kernel != "xla":
      out = attention_kernels.run(kernel, q, k, v, self.window, self.dtype)
    elif hooks is None or (not hooks.reads_attention(layer) and hooks.query_block_size(q.shape[1]) == q.shape[1]):
      out = softmax_attention(q, k, v, positions, self.window, self.dtype)
    else:
      block = hooks.query_block_size(q.shape[1])
      fold, state = hooks.attention_fold(layer)
      out, log_z, state = query_block_attention(
          q, k, v, positions, self.window, self.dtype, block,
          edit_logits=lambda s: hooks(hooks_lib.attn(layer, "logits"), s),
          edit_weights=lambda a: hooks(hooks_lib.attn(layer, "weights"), a), fold=fold, state=state,
          edited=hooks.edits_attention(layer))
      hooks.attention_folded(layer, state)
      hooks(hooks_lib.attn(layer, "log_z"), log_z)
    return precision.einsum("bthk,hkd->btd", out, self.wo[...], self.dtype)
