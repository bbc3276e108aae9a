"""Position probes (estimators/probes.py): the ridge fit, constant and near-constant features."""

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import probes
from helpers import K


def test_ridge_probe_matches_normal_equations():
  rng = np.random.default_rng(7)
  n, nl, t, p = 10, 2, 12, 5
  pos = np.log1p(np.arange(t))
  f = rng.normal(size=(n, nl, t, p)) * np.array([1.0, 10.0, 0.1, 1.0, 1.0])
  f[..., 0] += 5.0 * pos  # a readable position signal
  f += 50.0
  ids = np.arange(n) * 3
  acc1 = probes.update(probes.init(nl, p, K), jnp.asarray(f, jnp.float32), jnp.asarray(ids))
  acc3 = probes.init(nl, p, K)
  for part in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(probes.update)(acc3, jnp.asarray(f[part], jnp.float32), jnp.asarray(ids[part]))
  one, three = probes.finalize(acc1), probes.finalize(acc3)
  half = (ids % K) % 2
  for l in range(nl):
    rows = lambda k: f[half == k, l, 1:].reshape(-1, p)  # noqa: E731
    r2s, lams = [], []
    for fit, test in ((0, 1), (1, 0)):
      xf, xt = rows(fit), rows(test)
      yf, yt = np.tile(pos[1:], (half == fit).sum()), np.tile(pos[1:], (half == test).sum())
      af = np.c_[xf, np.ones(len(xf))]
      lam = 1e-2 * np.trace(np.cov(xf.T, bias=True)) * len(xf) / p
      theta = np.linalg.solve(af.T @ af + np.diag([lam] * p + [0.0]), af.T @ yf)
      pred = np.c_[xt, np.ones(len(xt))] @ theta
      r2s.append(1 - ((yt - pred) ** 2).sum() / ((yt - yt.mean()) ** 2).sum())
      lams.append(lam)
    for got in (one, three):
      np.testing.assert_allclose(got["ridge_lambda"][l], lams[0], rtol=1e-4)
      np.testing.assert_allclose(got["r2"][l], np.mean(r2s), atol=1e-4)
      assert got["n_fit"][l] == (half == 0).sum() * (t - 1)
  assert float(one["r2"].min()) > 0.5


def test_probe_on_constant_features_reads_nothing():
  """Features that are constant up to float rounding (the residual part of log Z under flat attention)."""
  t = 16
  f = np.broadcast_to(np.log1p(np.arange(t))[None, None, :, None], (8, 1, t, 3)).astype(np.float32)
  f = f - np.log1p(np.arange(t)).astype(np.float32)[None, None, :, None] * (1 + 1e-7)
  out = probes.finalize(probes.update(probes.init(1, 3, K), jnp.asarray(f), jnp.arange(8)))
  np.testing.assert_allclose(out["r2"], 0.0, atol=1e-5)


def test_probe_finalize_holds_one_lu_solve():
  """Both halves' ridge systems go through one batched LU: two at once deadlocked XLA CPU's 2-thread pool."""
  acc = probes.init(3, 5, K)
  hlo = jax.jit(probes.finalize).lower(acc).compile().as_text()
  assert hlo.count("getrf") == 1, [line for line in hlo.splitlines() if "getrf" in line]


def test_probe_on_states_equal_up_to_rounding_reads_nothing():
  """Large features identical across positions up to float32 rounding (one repeated token through a real LM):
  constant by their relative scatter, so no weight on the rounding pattern and R^2 ~ 0, not -1e7."""
  t, d = 32, 64
  rng = np.random.default_rng(0)
  base = rng.normal(size=d).astype(np.float32) * 8.0
  f = base[None, None, None, :] * (1 + 1e-6 * rng.normal(size=(8, 1, t, d))).astype(np.float32)
  out = probes.finalize(probes.update(probes.init(1, d, K), jnp.asarray(f, jnp.float32), jnp.arange(8)))
  assert float(out["ridge_lambda"][0]) == np.float32(1e20) and abs(float(out["r2"][0])) < 1e-3
