"""Intervals (estimators/intervals.py): the delete-one-block jackknife."""

import jax.numpy as jnp
import numpy as np
import scipy.special

from abspos_jax.analysis.estimators import intervals


def test_jackknife_of_a_mean_is_the_standard_error():
  """For a mean over blocks of equal size, the delete-one jackknife SE equals s / sqrt(g)."""
  rng = np.random.default_rng(4)
  g = 10
  x = rng.normal(size=g)
  sums, counts = jnp.asarray(x), jnp.ones(g)
  stacked = intervals.evaluate(lambda keep: (keep * sums).sum() / (keep * counts).sum(), g)
  ci = intervals.summarize(stacked, np.ones(g))
  se = x.std(ddof=1) / np.sqrt(g)
  np.testing.assert_allclose(ci["value"], x.mean(), rtol=1e-6)
  np.testing.assert_allclose(ci["se"], se, rtol=1e-5)
  t = scipy.stats.t.ppf(0.975, g - 1)
  np.testing.assert_allclose([ci["lo"], ci["hi"]], [x.mean() - t * se, x.mean() + t * se], rtol=1e-5)
  # An empty block is not left out; a statistic that breaks without a block has no interval.
  ci = intervals.summarize(intervals.evaluate(lambda keep: 1.0 / keep[0], 3), np.array([1, 1, 0]))
  assert np.isnan(ci["se"]) and ci["value"] == 1.0


def test_blocks_for_keeps_every_sequences_block():
  for k in (2, 16):
    for n in range(1, 40):
      b = intervals.blocks_for(n, k)
      assert b % 2 == 0 and b <= k and all(i % b == i % k for i in range(n)), (n, k, b)
  assert [intervals.blocks_for(n, 16) for n in (1, 4, 5, 16, 40)] == [2, 4, 6, 16, 16]
