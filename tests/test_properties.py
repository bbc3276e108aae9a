"""Property-based tests (hypothesis): masks, RoPE and estimators over random shapes and dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from abspos_jax import masks
from abspos_jax.analysis.estimators import denominators, leakage, fixed_effects
from abspos_jax.attention import masked_softmax
from abspos_jax.rope import apply_rope

SETTINGS = settings(max_examples=25, deadline=None)
JITTED = settings(max_examples=6, deadline=None)  # each new shape compiles the estimator
windows = st.one_of(st.none(), st.integers(1, 12))
# Shapes for the estimators: a few, so that examples reuse compiled programs (values still vary freely).
small_t = st.sampled_from([4, 7, 9])
small_windows = st.sampled_from([None, 3, 6])


@SETTINGS
@given(t=st.integers(1, 40), window=windows)
def test_mask_counts_and_convention(t, window):
  m = np.asarray(masks.causal_mask(t, window))
  i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
  want = (j <= i) & ((i - j < window) if window is not None else True)
  np.testing.assert_array_equal(m, want)
  np.testing.assert_array_equal(np.asarray(masks.num_visible(jnp.arange(t), window)), want.sum(1))


@SETTINGS
@given(half=st.integers(1, 16), i=st.integers(0, 500), j=st.integers(0, 500), shift=st.integers(0, 500),
       base=st.sampled_from([100.0, 10000.0, 1e6]), dtype=st.sampled_from(["float32", "bfloat16"]),
       seed=st.integers(0, 2**16))
def test_rope_depends_only_on_offset(half, i, j, shift, base, dtype, seed):
  d = 2 * half
  q, k = jax.random.normal(jax.random.key(seed), (2, 1, 1, 1, d)).astype(dtype)
  def score(a, b):
    qa = apply_rope(q, jnp.array([a]), base).astype(jnp.float32)
    kb = apply_rope(k, jnp.array([b]), base).astype(jnp.float32)
    return float(jnp.sum(qa * kb))
  tol = 1e-3 if dtype == "float32" else 0.1 * (1 + abs(score(i, j)))
  assert abs(score(i, j) - score(i + shift, j + shift)) <= tol
  # a rotation keeps the norm
  rotated = apply_rope(q, jnp.array([i]), base).astype(jnp.float32)
  np.testing.assert_allclose(jnp.linalg.norm(rotated), jnp.linalg.norm(q.astype(jnp.float32)),
                             rtol=1e-4 if dtype == "float32" else 2e-2)


@JITTED
@given(b=st.integers(1, 3), h=st.integers(1, 3), t=st.integers(1, 12), window=windows, scale=st.floats(0.0, 30.0),
       seed=st.integers(0, 2**16))
def test_masked_softmax_is_normalised_and_safe(b, h, t, window, scale, seed):
  s = scale * jax.random.normal(jax.random.key(seed), (b, h, t, t))
  mask = masks.causal_mask(t, window)
  _, a, log_z = masked_softmax(s, mask)
  a = np.asarray(a)
  assert np.isfinite(a).all() and np.isfinite(np.asarray(log_z)).all()
  np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-5)
  assert (a[:, :, ~np.asarray(mask)] == 0).all()
  want = np.log(np.where(np.asarray(mask), np.exp(np.asarray(s, np.float64)), 0).sum(-1))
  np.testing.assert_allclose(np.asarray(log_z), want, rtol=1e-5, atol=1e-5)


# One program per shape (op-by-op, finalize alone dispatched hundreds of small programs per example).
_DENOMINATORS = jax.jit(lambda acc, s, log_z, vis, ids: denominators.finalize(
    denominators.update(acc, s, log_z, vis, ids), vis))


@JITTED
@given(n=st.sampled_from([2, 5]), layers=st.integers(1, 2), heads=st.integers(1, 2), t=small_t, window=small_windows,
       seed=st.integers(0, 2**16))
def test_denominator_means_match_numpy(n, layers, heads, t, window, seed):
  vis = masks.causal_mask(t, window)
  s = jax.random.normal(jax.random.key(seed), (n, layers, heads, t, t))
  log_z = jax.nn.logsumexp(jnp.where(vis, s, -jnp.inf), -1)
  fin = _DENOMINATORS(denominators.init(layers, heads, t, 4), s, log_z, vis, jnp.arange(n))
  a = np.where(np.asarray(vis), np.exp(np.asarray(s) - np.asarray(log_z)[..., None]), 0.0)
  np.testing.assert_allclose(fin["log_z"], np.asarray(log_z).mean(0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(fin["sink_mass"], a[..., 0].mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(fin["max_weight"], a.max(-1).mean(0), rtol=1e-5, atol=1e-6)


@JITTED
@given(t=small_t, window=small_windows, seed=st.integers(0, 2**16))
def test_component_shares_are_defined_and_ignore_per_query_constants(t, window, seed):
  """Random logits (absolute position everywhere): the shares exist, sum to 1, and do not move when every
  logit of a query gets the same constant (the softmax, so log a, cannot see it)."""
  vis = masks.causal_mask(t, window)
  key_s, key_c = jax.random.split(jax.random.key(seed))
  s = 2.0 * jax.random.normal(key_s, (8, 1, 2, t, t))
  design = fixed_effects.make_design(vis)

  @jax.jit
  def shares(logits):
    log_z = jax.nn.logsumexp(jnp.where(vis, logits, -jnp.inf), -1)
    acc, *_ = leakage.update(leakage.init(1, 2, t, 2), logits, log_z, jnp.arange(8), design)
    fin = leakage.finalize(acc, design)
    return fin["share_mask"], fin["share_res"]

  mask, res = (np.asarray(x) for x in shares(s))
  assert np.isfinite(mask).all() and np.isfinite(res).all()
  np.testing.assert_allclose(mask + res, 1.0, atol=1e-4)
  shifted = s + 5.0 * jax.random.normal(key_c, (8, 1, 2, t, 1))
  np.testing.assert_allclose(np.asarray(shares(shifted)), np.stack([mask, res]), atol=1e-3)
