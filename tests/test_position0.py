"""Position-0 statistics (estimators/position0.py): trajectories, fingerprint groups."""

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import position0


def run_position0(h, tokens, vocab, parts=1):
  acc = position0.init(h.shape[1] - 1, h.shape[-1], vocab)
  for p in np.array_split(np.arange(h.shape[0]), parts):
    acc = jax.jit(position0.update)(acc, jnp.asarray(h[p], jnp.float32),
                                    jnp.asarray(tokens[p]))
  return position0.finalize(acc)


def test_position0_matches_numpy_and_groups():
  rng = np.random.default_rng(8)
  n, s, t, d, vocab = 12, 3, 5, 4, 6
  tokens = rng.integers(0, vocab, size=(n, t))
  tokens[:, 0] = rng.choice([1, 4, 5], size=n)
  means = rng.normal(size=(vocab, s, d)) * 3.0
  h = rng.normal(size=(n, s, t, d))
  h[:, :, 0] = means[tokens[:, 0]] + 0.1 * rng.normal(size=(n, s, d))
  one = run_position0(h, tokens, vocab)
  three = run_position0(h, tokens, vocab, parts=3)
  h0 = h[:, :, 0]
  norm0 = np.linalg.norm(h0, axis=-1).mean(0)
  spread = np.sqrt(((h0 - h0.mean(0)) ** 2).sum(-1).mean(0)) / norm0
  groups = [h0[tokens[:, 0] == g] for g in (1, 4, 5)]
  within = np.sqrt(sum(((g - g.mean(0)) ** 2).sum(-1).sum(0) for g in groups) / n) / norm0
  mus = [g.mean(0) / np.linalg.norm(g.mean(0), axis=-1, keepdims=True) for g in groups]
  cos = np.mean([(mus[a] * mus[b]).sum(-1) for a in range(3) for b in range(3) if a != b], 0)
  cos_prev = np.mean((h0[:, 1:] * h0[:, :-1]).sum(-1) / np.linalg.norm(h0[:, 1:], axis=-1)
                     / np.linalg.norm(h0[:, :-1], axis=-1), 0)
  ratio = norm0 / np.linalg.norm(h[:, :, 1:], axis=-1).mean((0, 2))
  for got in (one, three):
    np.testing.assert_allclose(got["pos0_norm"], norm0, rtol=1e-5)
    np.testing.assert_allclose(got["fingerprint_spread"], spread, rtol=1e-4)
    np.testing.assert_allclose(got["fingerprint_within"], within, rtol=1e-4)
    np.testing.assert_allclose(got["fingerprint_within"] ** 2 + got["fingerprint_between"] ** 2,
                               spread ** 2, rtol=1e-4)
    np.testing.assert_allclose(got["fingerprint_group_cos"], cos, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["pos0_cos_prev"], cos_prev, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["pos0_norm_ratio"], ratio, rtol=1e-5)
    assert int(got["num_groups"]) == 3


def test_fingerprint_zero_when_position0_is_shared():
  rng = np.random.default_rng(9)
  n, s, t, d = 6, 3, 4, 8
  h = rng.normal(size=(n, s, t, d)).astype(np.float32)
  h[:, :, 0] = 100.0 * rng.normal(size=(s, d))  # the same h_0 for every input (BOS)
  tokens = rng.integers(1, 5, size=(n, t))
  tokens[:, 0] = 0
  out = run_position0(h, tokens, 5, parts=2)
  np.testing.assert_array_equal(out["fingerprint_spread"], 0.0)
  assert int(out["num_groups"]) == 1 and np.isnan(out["fingerprint_group_cos"]).all()
  h_b = h.copy()
  h_b[:, :, 1:] += 1.0
  np.testing.assert_array_equal(position0.closedness_max_abs_diff(h, h_b), 0.0)
  h_b[2, 1, 0, 3] += 0.5
  np.testing.assert_allclose(position0.closedness_max_abs_diff(h, h_b), [0.0, 0.5, 0.0])
