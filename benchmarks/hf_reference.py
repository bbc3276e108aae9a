"""The analysis a user would write today: transformers' eager forward plus NumPy statistics.

``HFAnalysis`` runs an exported model (:func:`abspos_jax.interop.hf.export`) with
``output_attentions=True`` and ``output_hidden_states=True``, batch by batch,
captures q and k with forward hooks on ``q_proj`` / ``k_proj`` (transformers
returns weights, not logits, and ``log Z`` cannot be read off the weights
alone), rebuilds the logits ``s_ij = R(i) q_i . R(j) k_j / sqrt(d_h)`` in NumPy
and folds the batch into the same sufficient statistics our pass keeps:

* denominators per (layer, head, query): sums and sums of squares of ``log Z``,
  the excess ``log Z - log|V(i)|``, entropy, max weight, sink mass ``a_i0``;
* leakage: per-cell sums and sums of squares of ``s`` and ``log a`` for each
  half of the sequences (``[L, H, 2, T, T]`` each);
* position 0: summed norms of ``h_0^l`` and of the other positions' states.

Batches are folded in as they come (never the whole cache), and each batch
layer by layer, which is the memory-friendly way to write it; the attention
tensors of one batch, ``[L, B, H, T, T]``, still come to the host, and the
per-cell sums are ``[L, H, 2, T, T]`` (4 of them: 9 GB for SmolLM2-135M at
1,024 tokens).
"""

import math

import numpy as np
import torch


def rope_numpy(x: np.ndarray, base: float) -> np.ndarray:
  """Half-split RoPE of ``x [B, H, T, d_h]`` at positions ``0 .. T-1`` (transformers' ``rotate_half``)."""
  t, d = x.shape[-2], x.shape[-1]
  inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float32) / d)
  freqs = np.arange(t, dtype=np.float32)[:, None] * inv
  emb = np.concatenate([freqs, freqs], -1)
  x1, x2 = np.split(x, 2, -1)
  return x * np.cos(emb) + np.concatenate([-x2, x1], -1) * np.sin(emb)


class HFAnalysis:
  """Accumulates the statistics above over batches of ``tokens [B, T]`` for a transformers Llama/Mistral model."""

  def __init__(self, model, seq_len: int):
    cfg = model.config
    self.model = model.eval()
    self.heads, self.layers = cfg.num_attention_heads, cfg.num_hidden_layers
    self.kv_repeat = self.heads // (getattr(cfg, "num_key_value_heads", None) or self.heads)
    self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
    self.base = float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
    self.visible = np.tri(seq_len, dtype=bool)
    self.log_v = np.log(self.visible.sum(-1)).astype(np.float32)
    self.captured: dict[str, torch.Tensor] = {}
    t, L, H = seq_len, self.layers, self.heads
    self.acc = {"n": 0, "ref": {}, "s1": {}, "s2": {},
                "pos0_norm": np.zeros(L + 1), "rest_norm": np.zeros(L + 1)}
    for q in ("log_z", "excess", "entropy", "max_weight", "sink_mass"):
      self.acc["s1"][q] = np.zeros((L, H, t), np.float32)
      self.acc["s2"][q] = np.zeros((L, H, t), np.float32)
    for q in ("s", "loga"):
      self.acc["s1"][q] = np.zeros((L, H, 2, t, t), np.float32)
      self.acc["s2"][q] = np.zeros((L, H, 2, t, t), np.float32)

  def _heads(self, x: torch.Tensor) -> np.ndarray:
    b, t, _ = x.shape
    return x.view(b, t, -1, self.head_dim).transpose(1, 2).numpy()

  def _fold(self, name: str, layer: int, x: np.ndarray, half: np.ndarray | None = None) -> None:
    """Add layer ``layer``'s ``x [B, H, ...]`` about a reference fixed at the first batch (as our accumulators do)."""
    acc = self.acc
    key = (name, layer)
    if key not in acc["ref"]:
      acc["ref"][key] = x.mean(0)
    y = x - acc["ref"][key]
    if half is None:
      acc["s1"][name][layer] += y.sum(0)
      acc["s2"][name][layer] += (y * y).sum(0)
    else:
      for k in (0, 1):
        acc["s1"][name][layer, :, k] += y[half == k].sum(0)
        acc["s2"][name][layer, :, k] += (y[half == k] ** 2).sum(0)

  def update(self, tokens: np.ndarray, seq_ids: np.ndarray) -> None:
    """Fold one batch in, layer by layer (one layer's ``[B, H, T, T]`` arrays at a time besides the attentions
    transformers returns)."""
    # Hooks for this forward only: a hook left on the shared model would keep this object (and its
    # gigabytes of sums) alive after the caller drops it.
    handles = [getattr(layer.self_attn, name).register_forward_hook(
        lambda mod, inp, out, key=f"{l}.{name}": self.captured.__setitem__(key, out.detach()))
        for l, layer in enumerate(self.model.model.layers) for name in ("q_proj", "k_proj")]
    try:
      with torch.inference_mode():
        out = self.model(torch.from_numpy(tokens.astype(np.int64)), output_attentions=True,
                         output_hidden_states=True)
    finally:
      for h in handles:
        h.remove()
    half = seq_ids % 2
    for l in range(self.layers):
      q = rope_numpy(self._heads(self.captured[f"{l}.q_proj"]), self.base)
      # Grouped-query attention: KV head j serves query heads j*r .. j*r+r-1.
      k = np.repeat(rope_numpy(self._heads(self.captured[f"{l}.k_proj"]), self.base), self.kv_repeat, axis=1)
      # A Python float keeps the logits float32 (NumPy 2 promotes float32 / np.float64 to float64).
      s = np.where(self.visible, q @ np.swapaxes(k, -1, -2) * (1.0 / math.sqrt(self.head_dim)), -np.inf)
      m = s.max(-1, keepdims=True)
      log_z = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
      log_a = np.where(self.visible, s - log_z[..., None], 0.0)
      a = np.where(self.visible, out.attentions[l].numpy(), 0.0)
      self._fold("log_z", l, log_z)
      self._fold("excess", l, log_z - self.log_v)
      self._fold("entropy", l, -(a * log_a).sum(-1))
      self._fold("max_weight", l, a.max(-1))
      self._fold("sink_mass", l, a[..., 0])
      self._fold("s", l, np.where(self.visible, s, 0.0), half)
      self._fold("loga", l, log_a, half)
    norms = np.linalg.norm(np.stack([h.numpy() for h in out.hidden_states], 1), axis=-1)  # [B, L+1, T]
    self.acc["pos0_norm"] += norms[:, :, 0].sum(0)
    self.acc["rest_norm"] += norms[:, :, 1:].mean(-1).sum(0)
    self.acc["n"] += len(tokens)

  def means(self) -> dict[str, np.ndarray]:
    """Mean over sequences of each per-query quantity, ``[L, H, T]``, and ``pos0_norm [L+1]``."""
    n = self.acc["n"]
    out = {q: self.acc["s1"][q] / n + np.stack([self.acc["ref"][(q, l)] for l in range(self.layers)])
           for q in ("log_z", "excess", "entropy", "max_weight", "sink_mass")}
    out["pos0_norm"] = self.acc["pos0_norm"] / n
    return out
