"""Sink-reading heads (Gu et al., 2024, "When Attention Sink Emerges").

Works on mean sink masses ``a_i0`` per (layer, head, query) that
``denominators.finalize`` returns (``sink_mass_half [2, L, H, T]``: the means
over the even and the odd blocks of sequences), so it needs no accumulator of
its own. The score of a head is the mean of ``a_i0`` over the queries
``i >= min_query`` *that see key 0* (``i < W`` under a sliding window of ``W``
keys; v1 averaged in the zeros past the window, so a perfect sliding-window
sink scored at most ``(W - min_query) / (T - min_query)``). Heads are chosen
on half 0 and measured on half 1, so that choosing the largest scores does not
inflate them:

* ``sink_score_select [L, H]``: the score on half 0;
* ``sink_heads [L, H]``: ``sink_score_select > epsilon``;
* ``sink_score [L, H]``: the score on half 1 (held out);
* ``sink_rate [L]``: fraction of a layer's heads chosen;
* ``sink_score_max_layer [L]``, ``sink_score_max []``: the held-out score of
  the head with the largest half-0 score (of each layer, overall).

Scores are NaN where no query ``i >= min_query`` sees key 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.outputs import schema


def scored_queries(visible: jax.Array, min_query: int) -> jax.Array:
  """``[T]`` or ``[L, T]`` bool: queries ``i >= min_query`` that see key 0 (``visible [..., T, T]``)."""
  q = jnp.arange(visible.shape[-1])
  return visible[..., :, 0] & (q >= min_query)


def sink_statistics(sink_mass_half: jax.Array, visible: jax.Array, min_query: int = 4,
                    epsilon: float = 0.3) -> dict[str, jax.Array]:
  """Sink scores from ``sink_mass_half [2, L, H, T]`` and the model's mask ``visible [T, T]`` or ``[L, T, T]``."""
  use = scored_queries(visible, min_query).astype(jnp.float32)
  use = use if use.ndim == 1 else use[:, None, :]  # [T] or [L, 1, T]
  count = use.sum(-1)
  score = jnp.where(count > 0, (sink_mass_half * use).sum(-1) / jnp.maximum(count, 1.0), jnp.nan)  # [2, L, H]
  select, measure = score[0], score[1]
  heads = select > epsilon
  top = jnp.argmax(jnp.where(jnp.isnan(select), -jnp.inf, select), -1)  # [L]
  top_layer = jnp.take_along_axis(measure, top[:, None], -1)[:, 0]
  best = jnp.argmax(jnp.where(jnp.isnan(select), -jnp.inf, select).reshape(-1))
  return dict(sink_score=measure, sink_score_select=select, sink_heads=heads,
              sink_rate=heads.mean(-1, dtype=jnp.float32), sink_score_max_layer=top_layer,
              sink_score_max=measure.reshape(-1)[best])


INTERVAL_KEYS = ("sink_score", "sink_score_max", "sink_score_max_layer")


def summarize(fin: dict[str, jax.Array], ci: dict) -> dict:
  """summary.json's sink entries from :func:`sink_statistics`'s results and the jackknife summary ``ci``
  (keys ``sinks.<name>``)."""
  return {"sink_rate": schema.tolist(fin["sink_rate"]),
          **schema.with_ci(ci, "sinks.sink_score_max", "sink_score_max"),
          **schema.with_ci(ci, "sinks.sink_score_max_layer", "sink_score_max_layer"),
          "sink_heads": [[int(l), int(h)] for l, h in zip(*np.nonzero(np.asarray(fin["sink_heads"])))],
          "sink_selection": "heads chosen on the even sequence blocks (score > epsilon), scores measured on the "
                            "odd ones"}


def arrays(fin: dict[str, jax.Array], ci: dict) -> dict[str, np.ndarray]:
  """stats.npz's sink arrays, each ``[layer, head]``: the held-out score with its bounds, the selection score."""
  return {"sink_score": np.asarray(ci["value"]["sinks.sink_score"]),
          "sink_score_lo": np.asarray(ci["lo"]["sinks.sink_score"]),
          "sink_score_hi": np.asarray(ci["hi"]["sinks.sink_score"]),
          "sink_score_select": np.asarray(fin["sink_score_select"])}
