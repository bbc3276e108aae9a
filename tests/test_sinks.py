"""Sink statistics (estimators/sinks.py): held out, over queries that see key 0."""

import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import sinks
from helpers import mask


def test_sink_statistics_are_held_out_and_see_key_0():
  t, w = 12, 6
  vis = np.stack([mask(t, w), mask(t)])
  mass = np.zeros((2, 2, 3, t), np.float32)  # [half, layer, head, query]
  mass[:, 0, 0, :w] = 1.0  # a perfect sliding-window sink: key 0 is gone for i >= W
  mass[0, 1, 1, 4:] = 0.5  # above epsilon on the selection half only
  mass[1, 1, 1, 4:] = 0.2
  mass[:, 1, 2, :4] = 1.0  # early queries do not count
  out = sinks.sink_statistics(jnp.asarray(mass), jnp.asarray(vis))
  np.testing.assert_allclose(out["sink_score"][0, 0], 1.0)  # v1 scored it (W - 4) / (T - 4) = 0.25
  np.testing.assert_allclose(out["sink_score_select"][1, 1], 0.5)
  np.testing.assert_allclose(out["sink_score"][1, 1], 0.2)
  np.testing.assert_array_equal(out["sink_heads"], [[1, 0, 0], [0, 1, 0]])
  np.testing.assert_allclose(out["sink_rate"], [1 / 3, 1 / 3])
  np.testing.assert_allclose(out["sink_score_max_layer"], [1.0, 0.2])  # the held-out score of the chosen head
  np.testing.assert_allclose(out["sink_score_max"], 1.0)
