"""RoPE: the relative property, the half-split layout, the NTK base."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax.rope import apply_rope, inverse_frequencies, ntk_base


def numpy_rope(x: np.ndarray, pos: int, base: float) -> np.ndarray:
  """Independent rotation: pair (x[k], x[k + d/2]) turns by pos * base**(-2k/d)."""
  d = x.shape[-1]
  out = np.empty_like(x)
  for k in range(d // 2):
    theta = pos * base ** (-2.0 * k / d)
    c, s = np.cos(theta), np.sin(theta)
    out[..., k] = x[..., k] * c - x[..., k + d // 2] * s
    out[..., k + d // 2] = x[..., k] * s + x[..., k + d // 2] * c
  return out


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_relative_property(base):
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 1, 1, 1, 16)).astype(np.float32)
  def score(i, j):
    qi = apply_rope(jnp.asarray(q), jnp.array([i]), base)
    kj = apply_rope(jnp.asarray(k), jnp.array([j]), base)
    return float(jnp.sum(qi * kj))
  for i, j, c in [(5, 2, 7), (9, 9, 100), (30, 0, 3)]:
    np.testing.assert_allclose(score(i, j), score(i + c, j + c), rtol=1e-4, atol=1e-5)


def test_half_split_matches_numpy():
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
  got = np.asarray(apply_rope(jnp.asarray(x), jnp.arange(5), 10000.0))
  want = np.stack([numpy_rope(x[:, t], t, 10000.0) for t in range(5)], axis=1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_position_zero_is_identity():
  x = jax.random.normal(jax.random.key(0), (1, 1, 2, 8))
  np.testing.assert_array_equal(apply_rope(x, jnp.array([0]), 10000.0), x)


def test_ntk_base_formula():
  assert ntk_base(10000.0, 8.0, 32) == pytest.approx(10000.0 * 8.0 ** (32 / 30))
  # NTK leaves the fastest frequency (k = 0) at 1 and slows the slowest one by alpha exactly.
  d, alpha = 32, 8.0
  plain, scaled = inverse_frequencies(d, 10000.0), inverse_frequencies(d, ntk_base(10000.0, alpha, d))
  assert float(scaled[0]) == 1.0
  np.testing.assert_allclose(float(plain[-1] / scaled[-1]), alpha, rtol=1e-5)
