"""Denominator statistics (estimators/denominators.py) against brute-force NumPy."""

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import denominators
from helpers import K, VIS_LG, mask, softmax_inputs


L, H, T = 2, 2, 8


def test_denominators_match_numpy_and_accumulate():
  rng = np.random.default_rng(6)
  n = 9
  s, log_z = softmax_inputs(20.0 + 2.0 * rng.normal(size=(n, L, H, T, T)), VIS_LG)
  ids = np.arange(n)
  acc1 = denominators.update(denominators.init(L, H, T, K), s, log_z, VIS_LG, ids)
  acc3 = denominators.init(L, H, T, K)
  for p in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(denominators.update)(acc3, s[p], log_z[p], VIS_LG, ids[p])
  one, three = denominators.finalize(acc1, VIS_LG), denominators.finalize(acc3, VIS_LG)
  vis = VIS_LG[:, None]
  a = np.where(vis, np.exp(s.astype(np.float64) - log_z[..., None]), 0.0)
  log_v = np.log(VIS_LG.sum(-1))
  with np.errstate(divide="ignore", invalid="ignore"):
    ent = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
  per_seq = dict(log_z=log_z, excess=log_z - log_v[:, None], entropy=ent,
                 max_weight=a.max(-1), sink_mass=a[..., 0])
  for q, v in per_seq.items():
    for got in (one, three):
      np.testing.assert_allclose(got[q], v.mean(0), atol=2e-5, err_msg=q)
      np.testing.assert_allclose(got[q + "_std"], v.std(0), atol=2e-5, err_msg=q)
  half = (ids % K) % 2
  for h in (0, 1):
    np.testing.assert_allclose(one["sink_mass_half"][h], a[half == h, ..., 0].mean(0), atol=2e-6)
  np.testing.assert_allclose(one["log_visible"], log_v, atol=1e-7)
  for l, k in ((0, 3), (1, T)):  # the local layer (W = 3) uses queries 0..2 only
    for h in range(H):
      slope = np.polyfit(log_v[l, :k], log_z.mean(0)[l, h, :k], 1)[0]
      np.testing.assert_allclose(one["log_z_slope"][l, h], slope, rtol=1e-4, atol=1e-5)
  assert np.isnan(denominators.finalize(acc1, np.stack([mask(T, 1)] * L))["log_z_slope"]).all()


def test_entropy_ignores_a_removed_key():
  """A key removed by an edit (logit -inf inside the mask, as sink_ablate does) adds nothing, not NaN."""
  s = np.zeros((1, 1, 1, 4, 4), np.float32)
  s[..., 1:, 0] = -np.inf
  s, log_z = softmax_inputs(s, mask(4))
  st_ = denominators.query_statistics(jnp.asarray(s), jnp.asarray(log_z), mask(4))
  np.testing.assert_allclose(st_["entropy"][0, 0, 0], [0.0, 0.0, np.log(2), np.log(3)], atol=1e-6)
