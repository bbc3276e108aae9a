"""Sink-reading heads (Gu et al., 2024, "When Attention Sink Emerges").

Works on the mean sink mass ``sink_mass [L, H, T]`` (mean over sequences of
``a_i0``) that ``denominators.finalize`` returns, so it needs no accumulator of
its own:

* ``sink_score [L, H]``: mean of ``sink_mass`` over queries ``i >= min_query``;
* ``sink_heads [L, H]``: ``sink_score > epsilon``;
* ``sink_rate [L]``: fraction of a layer's heads that are sink heads;
* ``sink_score_max_layer [L]``, ``sink_score_max []``: the largest scores.

Under a sliding window key 0 is invisible to queries ``i >= W``, where
``a_i0 = 0``; such layers score low by construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sink_statistics(sink_mass: jax.Array, min_query: int = 4,
                    epsilon: float = 0.3) -> dict[str, jax.Array]:
  """Sink scores from ``sink_mass [L, H, T]``; NaN scores when ``T <= min_query``."""
  score = sink_mass[..., min_query:].mean(-1)
  heads = score > epsilon
  return dict(sink_score=score, sink_heads=heads,
              sink_rate=heads.mean(-1, dtype=jnp.float32),
              sink_score_max_layer=score.max(-1), sink_score_max=score.max())
