"""FLOP counts, a measured matmul peak, and model FLOP utilisation (MFU).

Training FLOPs per token (PaLM appendix B convention, also levanter's):

    6 * N_matmul + 12 * L * T * D

``N_matmul = L * (2 D^2 + 2 D K d_h + 3 D F) + D V`` counts the weights that
take part in matrix multiplies (attention q and o, k and v with ``K`` key/value
heads, ``K d_h = D`` without grouped-query attention; SwiGLU gate, up, down; the
unembedding, tied or not; an embedding lookup is no matmul). ``12 L T D``
counts the attention scores and the weighted sum of values over all ``T`` keys
(forward ``4 T D`` per layer, backward twice that), without discounting the
causal mask, so MFU stays comparable across implementations.
"""

import functools
import time

import jax
import jax.numpy as jnp

from abspos_jax.model import ModelSpec

# Per-chip dense bf16 peaks in FLOP/s, for accelerators whose peak cannot be
# measured cheaply; used when train.peak_flops is 0 and the device kind matches.
KNOWN_PEAKS = {
    "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12,
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
}


def matmul_params(spec: ModelSpec) -> int:
  d, f, layers = spec.d_model, spec.mlp_dim, spec.num_layers
  kv = spec.kv_heads * spec.head_dim  # k and v project to kv_heads * d_h (< d with grouped-query attention)
  return layers * (2 * d * d + 2 * d * kv + 3 * d * f) + d * spec.vocab_size


def train_flops_per_token(spec: ModelSpec, seq_len: int, causal_half: bool = False) -> float:
  """``6 N + 12 L T D``: the weights' matmuls forward and backward, and the attention's ``q k`` and ``a v``
  over all ``T`` keys. ``causal_half`` counts only the keys a query sees, as MaxText's MFU does: ``T / 2``
  per query in a causal layer (``6 N + 6 L T D``), ``W - W^2 / (2 T)`` in a layer with a window of ``W < T``
  keys."""
  if not causal_half:
    return 6.0 * matmul_params(spec) + 12.0 * spec.num_layers * seq_len * spec.d_model
  keys = sum(seq_len / 2 if w is None or w >= seq_len else w - w * w / (2 * seq_len) for w in spec.layer_windows())
  return 6.0 * matmul_params(spec) + 12.0 * keys * spec.d_model


def forward_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
  return train_flops_per_token(spec, seq_len) / 3.0


@functools.lru_cache(maxsize=None)
def measured_peak_flops(n: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
  """Best FLOP/s of a jitted ``[n, n] @ [n, n]`` in ``dtype`` with float32 accumulation, on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)  # random, not constant: GPU clocks run higher on zeros
  f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
  f(a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    f(a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


def peak_flops_per_device(configured: float = 0.0) -> float:
  """``configured`` if > 0, else a known accelerator peak, else a measured matmul peak."""
  if configured > 0:
    return configured
  return known_peak(jax.devices()[0].device_kind) or measured_peak_flops()


def known_peak(device_kind: str) -> float:
  """The :data:`KNOWN_PEAKS` entry whose name ``device_kind`` starts with, else 0."""
  return next((peak for name, peak in KNOWN_PEAKS.items() if device_kind.startswith(name)), 0.0)
