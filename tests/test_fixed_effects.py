"""Fixed effects (estimators/fixed_effects.py) against least squares on dummy designs; the designs' checks."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from abspos_jax.analysis.estimators import fixed_effects as fe, leakage
from helpers import K, lstsq_fit, mask, np_phi, softmax_inputs, sums


MASKS = [(7, None), (8, 3), (6, 6), (9, 1), (9, 4)]


@pytest.mark.parametrize("t,window", MASKS)
def test_fixed_effects_match_lstsq(t, window):
  rng = np.random.default_rng(t * 10 + (window or 0))
  vis = mask(t, window)
  x = rng.normal(size=(5, t, t)) + rng.normal(size=(t, 1)) + 3.0 * rng.normal(size=(1, 1, t))
  design = fe.make_design(vis)
  os_, qs, ss = sums(vis, x)
  n = x.shape[0]
  coef_a = fe.fit_two_way(design, jnp.asarray(os_ / n, jnp.float32), jnp.asarray(qs / n, jnp.float32))
  coef_b = fe.fit_offset_only(design, jnp.asarray(os_ / n, jnp.float32))
  for coef, two_way in ((coef_a, True), (coef_b, False)):
    fitted, ref = lstsq_fit(vis, x, two_way)
    want_sse = sum(((v - fitted)[vis] ** 2).sum() for v in x)
    got = fe.sse(design, coef, jnp.asarray(os_), jnp.asarray(qs), jnp.asarray(ss), n)
    np.testing.assert_allclose(got, want_sse, rtol=1e-4, atol=1e-3)
    if two_way:
      np.testing.assert_allclose(fe.query_effect(design, coef), np_phi(vis, ref[t:]), atol=2e-5)


@pytest.mark.parametrize("window", [None, 24, "sink"])
def test_solve_equals_the_pseudo_inverse_at_longer_length(window):
  """The O(T) conjugate-gradient solve against G^+ in float64 at T = 96: causal, windowed, and causal without
  key 0 for queries i >= 1 (sink_ablate's cells), to float32 rounding of the coefficients."""
  t, rng = 96, np.random.default_rng(7)
  vis = mask(t) & ~((np.arange(t)[:, None] >= 1) & (np.arange(t)[None, :] == 0)) if window == "sink" else mask(t, window)
  design = fe.make_design(vis, keys=mask(t))
  i, j = np.nonzero(vis)
  s = rng.normal(size=(t, t)) + 2.0 * rng.normal(size=(t, 1)) + np.log1p(np.arange(t))
  offsets, queries = np.bincount(i - j, s[i, j], minlength=t), np.where(vis, s, 0).sum(1)
  incidence = np.zeros((t, t))
  incidence[i, i - j] = 1.0
  gram = np.block([[np.diag(incidence.sum(0)), incidence.T], [incidence, np.diag(incidence.sum(1))]])
  want = np.linalg.pinv(gram, rcond=1e-10, hermitian=True) @ np.concatenate([offsets, queries])
  got = fe.fit_two_way(design, jnp.asarray(offsets, jnp.float32), jnp.asarray(queries, jnp.float32))
  np.testing.assert_allclose(got, want, atol=2e-6 * np.abs(want).max())


@settings(max_examples=15, deadline=None)
@given(t=st.integers(2, 10), window=st.one_of(st.none(), st.integers(1, 10)), seed=st.integers(0, 2**16))
def test_query_function_and_linearity(t, window, seed):
  rng = np.random.default_rng(seed)
  vis = mask(t, window)
  design = fe.make_design(vis)

  def phi(x):
    os_, qs, _ = sums(vis, x[None])
    return fe.query_effect(design, fe.fit_two_way(design, jnp.asarray(os_, jnp.float32),
                                                  jnp.asarray(qs, jnp.float32)))

  f = rng.normal(size=t)
  np.testing.assert_allclose(phi(np.broadcast_to(f[:, None], (t, t))), np_phi(vis, f), atol=1e-5)
  np.testing.assert_allclose(fe.query_function_effect(design, jnp.asarray(f, jnp.float32)), np_phi(vis, f), atol=1e-6)
  x, y = rng.normal(size=(2, t, t))
  np.testing.assert_allclose(phi(x + y), phi(x) + phi(y), atol=1e-5)
  g = rng.normal(size=t)  # a pure offset function has no query effect
  np.testing.assert_allclose(phi(g[np.clip(np.subtract.outer(np.arange(t), np.arange(t)), 0, t - 1)]), 0.0,
                             atol=1e-5)


def test_make_design_rejects_bad_masks():
  with pytest.raises(ValueError, match="causal"):
    fe.make_design(np.ones((4, 4), bool))
  bad = mask(4)
  bad[2, 2] = False
  with pytest.raises(ValueError, match="see itself"):
    fe.make_design(bad)
  gap = mask(5)
  gap[4, 2] = False
  with pytest.raises(ValueError, match="contiguous"):
    fe.make_design(gap)
  shrinking = mask(5) & ~((np.arange(5)[:, None] == 4) & (np.arange(5)[None, :] < 3))  # query 4: 2 cells, 3: 4
  with pytest.raises(ValueError, match="as many for a later query"):
    fe.make_design(shrinking, keys=mask(5))
  stacked = fe.make_design(np.stack([mask(5), mask(5, 2), mask(5)]))
  assert stacked.first_query.shape == (3, 5)
  # References of the mask-only normaliser: n keys none of which is key 0; p = T-1 for n = T.
  d = fe.make_design(mask(5))
  np.testing.assert_array_equal(d.ref_count, [4, 3, 2, 1, 1])
  refs = np.asarray(fe.row_masks(d, 0, 5)[2])
  assert bool(refs[4, 4]) and not bool(refs[3, 3])
  np.testing.assert_array_equal(refs[1:3], np.asarray(fe.row_masks(d, 1, 2)[2]))  # any block of rows
  np.testing.assert_array_equal(fe.make_design(mask(6, 3)).ref_count, [5, 4, 3, 0, 0, 0])


def test_sink_ablate_cells_keep_one_normaliser_per_head():
  """Flat logits with key 0 removed from the cells: whether the softmax still sees key 0 (reference pass)
  or not (ablated pass), the split books everything to the mask when the normaliser counts the right keys."""
  t = 12
  cells = mask(t) & ~((np.arange(t)[:, None] >= 1) & (np.arange(t)[None, :] == 0))
  flat = np.zeros((8, 1, 1, t, t))
  for keys, softmax_mask in ((mask(t), mask(t)), (cells, cells)):
    s, log_z = softmax_inputs(flat, softmax_mask)
    design = fe.make_design(cells, keys=keys)
    acc, *_ = leakage.update(leakage.init(1, 1, t, K), jnp.asarray(np.zeros((8, 1, 1, t, t), np.float32)),
                            jnp.asarray(log_z), jnp.arange(8), design)
    fin = leakage.finalize(acc, design)
    np.testing.assert_allclose(fin["var_res"], 0.0, atol=1e-9)
    np.testing.assert_allclose(fin["share_mask_overall"], 1.0, atol=1e-5)
