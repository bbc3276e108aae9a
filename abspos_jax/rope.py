"""Rotary position embeddings (RoPE) and the NTK-aware base.

Half-split layout (the Hugging Face Llama convention): the head dimension is
split into two halves ``x = [x1, x2]`` and feature pair ``(x1[k], x2[k])``
rotates by angle ``p * theta_k`` with ``theta_k = base ** (-2k / d_h)``.
Because rotations compose, ``R(i) q . R(j) k = q . R(j - i) k``: the logit
depends on positions only through the offset.
"""

import jax
import jax.numpy as jnp
import numpy as np


def ntk_base(rope_base: float, alpha: float, head_dim: int) -> float:
  """NTK-aware base: ``rope_base * alpha ** (d_h / (d_h - 2))``."""
  if head_dim <= 2:
    raise ValueError(f"NTK scaling needs head_dim > 2, got {head_dim}")
  return rope_base * alpha ** (head_dim / (head_dim - 2))


def inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
  """``theta_k = base ** (-2k / d_h)`` for ``k = 0 .. d_h/2 - 1``: float32, shape ``[d_h/2]``.

  A NumPy array: it depends only on static numbers, so it is a constant under ``jit``.
  """
  return (1.0 / base ** (np.arange(0, head_dim, 2) / head_dim)).astype(np.float32)


def rope_angles(positions: jax.Array | np.ndarray, head_dim: int, base: float) -> tuple[jax.Array, jax.Array]:
  """Cosines and sines for ``positions [..., T]``: each ``[..., T, d_h]``.

  The two halves of the last axis repeat the same ``d_h/2`` angles
  (``emb = concat(freqs, freqs)``), matching :func:`rotate_half`.

  NumPy ``positions`` (the model's ``0 .. T-1``, known when it is traced)
  give NumPy tables, which enter the compiled step as constants: traced
  tables were recomputed by XLA inside every fusion that reads them, a
  ``cos`` and a ``sin`` per element of q and k in every layer, forward and
  backward (``docs/benchmarks.md`` counts them and measures the difference).
  Either way the angle is the float32 product ``p * theta_k``; NumPy rounds
  its cosine and sine correctly.
  """
  if isinstance(positions, np.ndarray):
    freqs = (positions.astype(np.float32)[..., None] * inverse_frequencies(head_dim, base)).astype(np.float64)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)
  freqs = positions.astype(jnp.float32)[..., None] * inverse_frequencies(head_dim, base)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def rotate_half(x: jax.Array) -> jax.Array:
  """``[x1, x2] -> [-x2, x1]`` on the last axis."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """Rotate ``x [B, T, H, d_h]`` by ``positions [B, T]`` (or ``[T]``).

  ``x * cos + rotate_half(x) * sin``, computed in float32 and cast back.
  """
  cos, sin = rope_angles(positions, x.shape[-1], base)
  if cos.ndim == 2:
    cos, sin = cos[None], sin[None]
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # broadcast over heads
  xf = x.astype(jnp.float32)
  return (xf * cos + rotate_half(xf) * sin).astype(x.dtype)
