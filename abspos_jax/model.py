"""The decoder: one Llama-style model, switched by ``config.model``.

Token embedding (plus learned absolute positions for ``position="learned"``),
``num_layers`` pre-norm blocks of RMSNorm -> attention -> residual add ->
RMSNorm -> SwiGLU -> residual add, a final RMSNorm and the unembedding (tied to
the embedding or not). No biases by default; ``qkv_bias`` adds the q/k/v biases
of Qwen2-style checkpoints, and ``num_kv_heads < num_heads`` gives grouped-query
attention (both exist so that imported Hugging Face models run exactly). The
position scheme only changes what the attention does with positions:

- ``rope``: RoPE with ``rope_base``;
- ``ntk``: RoPE with the NTK-aware base ``rope_base * ntk_alpha ** (d_h/(d_h-2))``;
- ``swa``: RoPE plus a sliding window of ``window`` keys, optionally only on the
  ``L`` layers of ``layer_pattern`` (``G`` layers stay global);
- ``nope``: no position signal; ``learned``: absolute embeddings, no RoPE.
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import precision
from abspos_jax.attention import Attention
from abspos_jax import hooks as hooks_lib
from abspos_jax.hooks import Hooks
from abspos_jax.layers import RMSNorm, SwiGLU, param
from abspos_jax.rope import ntk_base

POSITIONS = ("rope", "ntk", "swa", "nope", "learned")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """Resolved model hyper-parameters (see ``configs/base.py`` for each field)."""

  position: str
  num_layers: int
  d_model: int
  num_heads: int
  mlp_dim: int
  vocab_size: int
  max_len: int
  rope_base: float
  ntk_alpha: float
  window: int
  layer_pattern: str
  tie_embeddings: bool
  norm_eps: float
  init_std: float
  dtype: str
  param_dtype: str
  attention_impl: str
  # Fields added after the first runs were saved: a stored config.json without
  # them gets these defaults (today's behaviour) when it is loaded.
  num_kv_heads: int = 0
  qkv_bias: bool = False

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "ModelSpec":
    m = config.model
    mlp_dim = m.mlp_dim or -(-8 * m.d_model // 3 // 64) * 64
    fields = {f.name: m.get(f.name, f.default) if f.default is not dataclasses.MISSING else m[f.name]
              for f in dataclasses.fields(cls) if f.name not in ("mlp_dim", "max_len")}
    return cls(mlp_dim=mlp_dim, max_len=m.max_len or config.data.seq_len, **fields)

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def kv_heads(self) -> int:
    """Key/value heads: ``num_kv_heads``, or ``num_heads`` when it is 0 (plain multi-head attention)."""
    return self.num_kv_heads or self.num_heads

  def attention_base(self) -> float | None:
    """The RoPE base used by every layer, or None without RoPE."""
    if self.position in ("rope", "swa"):
      return self.rope_base
    if self.position == "ntk":
      return ntk_base(self.rope_base, self.ntk_alpha, self.head_dim)
    return None

  def layer_windows(self) -> tuple[int | None, ...]:
    """Per layer: the sliding window in keys, or None for full causal attention."""
    if self.position != "swa":
      return (None,) * self.num_layers
    pattern = self.layer_pattern or "L"
    return tuple(self.window if pattern[l % len(pattern)] == "L" else None for l in range(self.num_layers))


class Block(nnx.Module):
  """Pre-norm residual block: ``h += attn(norm(h)); h += mlp(norm(h))``."""

  def __init__(self, spec: ModelSpec, window: int | None, *, rngs: nnx.Rngs):
    dtype, pdtype = jnp.dtype(spec.dtype), jnp.dtype(spec.param_dtype)
    out_std = spec.init_std / (2 * spec.num_layers) ** 0.5  # GPT-2 style: keep the residual variance O(1)
    self.attn_norm = RMSNorm(spec.d_model, eps=spec.norm_eps, param_dtype=pdtype)
    self.attn = Attention(
        spec.d_model, spec.num_heads, num_kv_heads=spec.kv_heads, qkv_bias=spec.qkv_bias, window=window,
        rope_base=spec.attention_base(), impl=spec.attention_impl, std=spec.init_std, out_std=out_std,
        param_dtype=pdtype, dtype=dtype, rngs=rngs)
    self.mlp_norm = RMSNorm(spec.d_model, eps=spec.norm_eps, param_dtype=pdtype)
    self.mlp = SwiGLU(spec.d_model, spec.mlp_dim, std=spec.init_std, out_std=out_std, param_dtype=pdtype,
                      dtype=dtype, rngs=rngs)

  def __call__(self, h: jax.Array, positions: jax.Array, *, hooks: Hooks | None, layer: int) -> jax.Array:
    a = self.attn(self.attn_norm(h), positions, hooks=hooks, layer=layer)
    if hooks is not None:
      a = hooks(hooks_lib.attn(layer, "out"), a)
    h = h + a
    m = self.mlp(self.mlp_norm(h))
    if hooks is not None:
      m = hooks(hooks_lib.mlp_out(layer), m)
    return h + m


class Decoder(nnx.Module):
  """Decoder-only Transformer. ``model(tokens [B, T]) -> logits [B, T, V]`` (float32)."""

  def __init__(self, spec: ModelSpec, *, rngs: nnx.Rngs):
    pdtype = jnp.dtype(spec.param_dtype)
    self.spec = spec
    self.embed = param(rngs, (spec.vocab_size, spec.d_model), ("vocab", "embed"), spec.init_std, pdtype)
    if spec.position == "learned":
      self.pos_embed = param(rngs, (spec.max_len, spec.d_model), ("positions", "embed"), spec.init_std, pdtype)
    self.blocks = nnx.List([Block(spec, w, rngs=rngs) for w in spec.layer_windows()])
    self.final_norm = RMSNorm(spec.d_model, eps=spec.norm_eps, param_dtype=pdtype)
    if not spec.tie_embeddings:
      self.unembed = param(rngs, (spec.d_model, spec.vocab_size), ("embed", "vocab"), spec.init_std, pdtype)

  def __call__(self, tokens: jax.Array, *, hooks: Hooks | None = None) -> jax.Array:
    """Logits for ``tokens [B, T]`` at positions ``0 .. T-1``; see :mod:`abspos_jax.hooks` for points."""
    return self.logits(self.features(tokens, hooks=hooks))

  def features(self, tokens: jax.Array, *, hooks: Hooks | None = None) -> jax.Array:
    """The final-normed residual stream that the head reads, ``[B, T, D]``: the model without :meth:`logits`
    (which the analysis's loss applies a chunk of tokens at a time, ``loss.chunked_lm_loss``)."""
    point = hooks if hooks is not None else (lambda _, v: v)
    spec = self.spec
    if hooks is not None:
      hooks.check(spec.num_layers)
    positions = np.arange(tokens.shape[1])  # static: RoPE tables become constants (rope.rope_angles)
    h = point(hooks_lib.EMBED_TOKENS, jnp.take(self.embed[...], tokens, axis=0).astype(jnp.float32))
    if spec.position == "learned":
      h = h + self.pos_embed[...][: tokens.shape[1]].astype(jnp.float32)[None]
    h = point(hooks_lib.resid(0), h)
    for l, block in enumerate(self.blocks):
      h = point(hooks_lib.resid(l + 1), block(h, positions, hooks=hooks, layer=l))
    return self.final_norm(h)

  def logits(self, h: jax.Array) -> jax.Array:
    """The output head, ``h [B, T, D] -> [B, T, V]`` (the embedding when tied)."""
    spec = self.spec
    if spec.tie_embeddings:  # contract with [V, D] as stored: XLA CPU has no bf16 kernel for the transposed form
      return precision.einsum("btd,vd->btv", h, self.embed[...], spec.dtype)
    return precision.einsum("btd,dv->btv", h, self.unembed[...], spec.dtype)


def create(config: ml_collections.ConfigDict, seed: int | jax.Array | None = None) -> Decoder:
  """Build the model of ``config`` with parameters drawn from ``seed`` (default ``train.seed``).

  ``seed`` may also be a PRNG key: ``jax.random.key(s)`` draws what ``s`` draws.
  """
  seed = config.train.seed if seed is None else seed
  return Decoder(ModelSpec.from_config(config), rngs=nnx.Rngs(params=seed))
