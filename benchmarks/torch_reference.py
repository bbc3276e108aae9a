"""A straightforward PyTorch implementation of our decoder, for side-by-side benchmarks.

The same architecture as :class:`abspos_jax.model.Decoder` with ``position="rope"``
and tied embeddings: token embedding, pre-norm blocks of RMSNorm -> attention
(q/k/v/o projections without biases, half-split RoPE, causal
``scaled_dot_product_attention``) -> residual add -> RMSNorm -> SwiGLU ->
residual add, final RMSNorm, tied unembedding. The optimizer is AdamW with
global-norm clipping and weight decay on matrices only (as :mod:`abspos_jax.optim`).
Nothing here is compiled: this is the loop a user would write first.
``load_from_jax`` copies our parameters in, so both sides start from the same weights.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
  def __init__(self, dim: int, eps: float):
    super().__init__()
    self.scale = nn.Parameter(torch.ones(dim))
    self.eps = eps

  def forward(self, x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.scale


def rope_tables(seq_len: int, head_dim: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
  """``cos, sin [T, d_h]`` of the half-split layout (both halves repeat the ``d_h/2`` angles)."""
  inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
  freqs = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv
  emb = torch.cat([freqs, freqs], -1)
  return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
  """``x [B, H, T, d_h]``: ``x cos + rotate_half(x) sin``."""
  x1, x2 = x.chunk(2, -1)
  return x * cos + torch.cat([-x2, x1], -1) * sin


class Block(nn.Module):
  def __init__(self, d_model: int, num_heads: int, mlp_dim: int, eps: float):
    super().__init__()
    self.num_heads = num_heads
    self.attn_norm, self.mlp_norm = RMSNorm(d_model, eps), RMSNorm(d_model, eps)
    self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
    self.gate, self.up = nn.Linear(d_model, mlp_dim, bias=False), nn.Linear(d_model, mlp_dim, bias=False)
    self.down = nn.Linear(mlp_dim, d_model, bias=False)

  def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    b, t, d = h.shape
    x = self.attn_norm(h)
    q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + self.o(a.transpose(1, 2).reshape(b, t, d))
    x = self.mlp_norm(h)
    return h + self.down(F.silu(self.gate(x)) * self.up(x))


class Decoder(nn.Module):
  """``Decoder(spec)(tokens [B, T]) -> logits [B, T, V]`` for a :class:`abspos_jax.model.ModelSpec` (rope, tied)."""

  def __init__(self, spec):
    super().__init__()
    if spec.position != "rope" or not spec.tie_embeddings or spec.kv_heads != spec.num_heads or spec.qkv_bias:
      raise ValueError("the reference covers position=rope, tied embeddings, no GQA, no q/k/v biases")
    self.embed = nn.Embedding(spec.vocab_size, spec.d_model)
    self.blocks = nn.ModuleList(Block(spec.d_model, spec.num_heads, spec.mlp_dim, spec.norm_eps)
                                for _ in range(spec.num_layers))
    self.final_norm = RMSNorm(spec.d_model, spec.norm_eps)
    self.head_dim, self.rope_base = spec.head_dim, spec.rope_base

  def forward(self, tokens: torch.Tensor) -> torch.Tensor:
    cos, sin = rope_tables(tokens.shape[1], self.head_dim, self.rope_base)
    h = self.embed(tokens)
    for block in self.blocks:
      h = block(h, cos, sin)
    return self.final_norm(h) @ self.embed.weight.T


def make_optimizer(model: nn.Module, train) -> torch.optim.AdamW:
  """AdamW of ``config.train`` (constant ``learning_rate``); decay on matrices only."""
  params = list(model.parameters())
  groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": train.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
  return torch.optim.AdamW(groups, lr=train.learning_rate, betas=(train.beta1, train.beta2), eps=1e-8)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor, grad_clip: float,
               autocast: bool = False) -> float:
  """One step on ``tokens [B, T + 1]``: next-token cross entropy, clip, AdamW. Returns the loss.

  ``autocast``: forward and loss under ``torch.autocast("cpu", dtype=torch.bfloat16)``
  (the recipe of the PyTorch AMP docs: backward and optimizer outside it, on float32 weights).
  """
  with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
  opt.zero_grad(set_to_none=True)
  loss.backward()
  torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
  opt.step()
  return loss.item()


def load_from_jax(model: Decoder, jax_model) -> None:
  """Copy the parameters of our ``jax_model`` (same spec) into ``model``."""
  t = lambda x: torch.from_numpy(np.array(x[...], np.float32))
  with torch.no_grad():
    model.embed.weight.copy_(t(jax_model.embed))
    model.final_norm.scale.copy_(t(jax_model.final_norm.scale))
    for ours, ref in zip(jax_model.blocks, model.blocks):
      ref.attn_norm.scale.copy_(t(ours.attn_norm.scale))
      ref.mlp_norm.scale.copy_(t(ours.mlp_norm.scale))
      for name in ("q", "k", "v"):  # [D, H, d_h] -> [H * d_h, D]
        w = t(getattr(ours.attn, "w" + name))
        getattr(ref, name).weight.copy_(w.reshape(w.shape[0], -1).T)
      wo = t(ours.attn.wo)  # [H, d_h, D] -> [D, H * d_h]
      ref.o.weight.copy_(wo.reshape(-1, wo.shape[-1]).T)
      for name in ("gate", "up", "down"):
        getattr(ref, name).weight.copy_(t(getattr(ours.mlp, name)).T)
