"""Denominator statistics per (layer, head, query): mean and spread over sequences.

Per sequence, layer ``l``, head ``h``, query ``i`` (``a_ij = exp(s_ij - log Z_i)``
on the visible keys ``V(i)``):

* ``log_z``: ``log Z_i``;
* ``excess``: ``E_i = log Z_i - log|V(i)|`` (log of the mean exp-logit);
* ``entropy``: ``-sum_j a_ij log a_ij``;
* ``max_weight``: ``max_j a_ij``;
* ``sink_mass``: ``a_i0`` (0 where key 0 is not visible, e.g. past a sliding window).

Sums are kept per block of sequences (``seq_id % K``, as in :mod:`leakage`)
so that :mod:`intervals` can leave blocks out. ``finalize(acc, visible, keep)``
returns the mean over the kept sequences, the population std (ddof 0) and the
sink mass of each half (even / odd blocks: :mod:`sinks` selects heads on one
and measures them on the other). Sums are taken of ``x - ref`` with ``ref``
the first batch's mean, fixed afterwards, so the variance does not cancel
when the mean is large against the spread (``log Z`` of long sequences).

``log_z_slope``: per (l, h), the OLS slope of mean ``log Z_i`` on
``log|V(i)|`` over queries, each query weighted once, using only the queries
at which ``|V(i)|`` reaches a new maximum (all of them for a causal mask; ``i <
W`` for a sliding window of ``W`` keys, past which ``log|V|`` is constant).
NaN with fewer than two such queries.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import fixed_effects as fe

from abspos_jax.analysis.passes import accumulators

from abspos_jax.analysis.outputs import schema

QUANTITIES = ("log_z", "excess", "entropy", "max_weight", "sink_mass")


def log_visible(visible: jax.Array) -> jax.Array:
  """``log|V(i)|``: ``[..., T, T] -> [..., T]``."""
  return jnp.log(visible.sum(-1).astype(jnp.float32))


def query_statistics(logits: jax.Array, log_z: jax.Array,
                     visible: jax.Array) -> dict[str, jax.Array]:
  """Per-sequence ``QUANTITIES``, each ``[B, L, H, T]``.

  ``logits [B, L, H, T, T]`` (ignored off ``visible``), ``log_z [B, L, H, T]``,
  ``visible`` bool ``[T, T]`` or ``[L, T, T]``. Also the attention features a
  probe can read.
  """
  vis = fe.layer_mask(visible)

  def one_sequence(x: tuple[jax.Array, jax.Array]) -> dict[str, jax.Array]:
    s, lz = x  # [L, H, T, T], [L, H, T]
    log_a = jnp.where(vis, s - lz[..., None], 0.0)
    a = jnp.where(vis, jnp.exp(log_a), 0.0)
    return weight_statistics(a, log_a, jnp.zeros((1, 1), jnp.int32))

  # One sequence at a time, so that each step's [L, H, T, T] stays in cache: 2.4x faster on CPU
  # than the same expressions over the whole batch (docs/benchmarks.md).
  out = jax.lax.map(one_sequence, (logits, log_z))
  log_v = log_visible(visible)
  return dict(log_z=log_z, excess=log_z - (log_v if visible.ndim == 2 else log_v[:, None]), **out)


def weight_statistics(a: jax.Array, log_a: jax.Array, key0: jax.Array) -> dict[str, jax.Array]:
  """``entropy``, ``max_weight`` and ``sink_mass`` from weights ``a [..., R, T]`` (0 off the keys) and ``log a``.

  Rows are queries; along the last axis any order of the keys, key 0 of row
  ``r`` at index ``key0[..., r, 0]`` (0 in key order; the query's own index in
  skew coordinates, as :mod:`leakage` holds them); an index past the last
  column means key 0 is not among the row's keys (``sink_mass`` 0, as for a
  key 0 outside a window). A key removed by an edit (logit -inf, as
  ``sink_ablate`` does) has ``a = 0`` and adds nothing (not ``0 * -inf``).
  """
  at = jnp.broadcast_to(key0, a.shape[:-1] + (1,))
  sink = jnp.take_along_axis(a, jnp.minimum(at, a.shape[-1] - 1), -1)[..., 0]
  return dict(entropy=-jnp.where(a > 0, a * log_a, 0.0).sum(-1), max_weight=a.max(-1),
              sink_mass=jnp.where(at[..., 0] < a.shape[-1], sink, 0.0))


def init(num_layers: int, num_heads: int, seq_len: int, num_blocks: int) -> dict:
  """Zero accumulator: per quantity ``s1, s2 [K, L, H, T]`` and ``ref [L, H, T]``; ``n [K]``."""
  zeros = jnp.zeros((num_layers, num_heads, seq_len), jnp.float32)
  blocks = jnp.zeros((num_blocks,) + zeros.shape, jnp.float32)
  return dict(n=jnp.zeros((num_blocks,), jnp.float32),
              **{q: dict(s1=blocks, s2=blocks, ref=zeros) for q in QUANTITIES})


def update(acc: dict, logits: jax.Array, log_z: jax.Array, visible: jax.Array, seq_ids: jax.Array) -> dict:
  """Adds a batch (shapes as in ``query_statistics``; ``seq_ids [B]`` pick the blocks)."""
  return accumulate(acc, query_statistics(logits, log_z, visible), seq_ids)


def accumulate(acc: dict, stats: dict[str, jax.Array], seq_ids: jax.Array) -> dict:
  """Adds a batch's ``query_statistics`` (each ``[B, L, H, T]``), computed once by a caller that also uses them."""
  for layer in range(stats["log_z"].shape[1]):
    acc = accumulate_layer(acc, layer, {q: v[:, layer] for q, v in stats.items()}, seq_ids)
  return accumulators.count(acc, seq_ids)


def accumulate_layer(acc: dict, layer: int, stats: dict[str, jax.Array], seq_ids: jax.Array) -> dict:
  """Adds one layer's statistics (each ``[B, H, T]``) to ``acc``'s slice ``layer``.

  ``n`` is left to :func:`accumulators.count`, once per batch.
  """
  part = accumulators.view(acc, layer)
  num_blocks = acc["n"].shape[0]
  onehot = jax.nn.one_hot(seq_ids % num_blocks, num_blocks, dtype=jnp.float32)
  out = dict(n=part["n"])
  seen = acc["n"].sum() > 0
  for q in QUANTITIES:
    x = stats[q].astype(jnp.float32)[:, None]
    ref = jnp.where(seen, part[q]["ref"], x.mean(0))
    y = x - ref
    add = lambda a, v: a + jnp.einsum("bk,b...->k...", onehot, v, precision=fe.HIGHEST)  # noqa: E731
    out[q] = dict(s1=add(part[q]["s1"], y), s2=add(part[q]["s2"], y * y), ref=ref)
  return accumulators.write(acc, layer, out)



def _slope(x: jax.Array, y: jax.Array, counts: jax.Array) -> jax.Array:
  """OLS slope of ``y [L, H, T]`` on ``x`` over the queries where ``counts`` reaches a new maximum.

  ``x`` and ``counts`` are ``[T]`` (shared mask) or ``[L, T]``.
  """
  running_max = jax.lax.cummax(counts, axis=counts.ndim - 1)
  previous = jnp.concatenate([jnp.zeros_like(counts[..., :1]), running_max[..., :-1]], -1)
  use = (counts > previous)[..., None, :]  # [1 or L, 1, T]
  x = x[..., None, :]
  k = use.sum(-1, keepdims=True)

  def centre(v: jax.Array) -> jax.Array:
    mean = jnp.where(use, v, 0.0).sum(-1, keepdims=True) / jnp.maximum(k, 1)
    return jnp.where(use, v - mean, 0.0)

  xc, yc = centre(x), centre(y)
  sxx = (xc * xc).sum(-1)
  ok = (k[..., 0] >= 2) & (sxx > 0)
  return jnp.where(ok, (xc * yc).sum(-1) / jnp.where(ok, sxx, 1.0), jnp.nan)


def finalize(acc: dict, visible: jax.Array, keep: jax.Array | None = None) -> dict[str, jax.Array]:
  """Means and stds over the kept sequences (jittable; ``keep [K]``, default all blocks).

  Returns ``Q [L, H, T]`` and ``Q_std [L, H, T]`` for every ``Q`` in
  ``QUANTITIES``; ``sink_mass_half [2, L, H, T]`` (means over the kept even /
  odd blocks); ``log_visible`` (``[T]`` for a ``[T, T]`` mask, ``[L, T]`` for
  ``[L, T, T]``); ``log_z_slope [L, H]``; ``n_sequences []``; and the
  per-layer means of :data:`LAYER_MEANS`, each ``[L]``.
  """
  keep = jnp.ones_like(acc["n"]) if keep is None else keep
  parity = jnp.arange(keep.shape[0]) % 2
  halves = jnp.stack([keep * (parity == 0), keep * (parity == 1)])
  n_all = keep @ acc["n"]
  n = jnp.maximum(n_all, 1.0)
  out = {}
  for q in QUANTITIES:
    m1 = jnp.einsum("k,k...->...", keep, acc[q]["s1"]) / n
    out[q] = m1 + acc[q]["ref"]
    m2 = jnp.einsum("k,k...->...", keep, acc[q]["s2"]) / n
    out[q + "_std"] = jnp.sqrt(jnp.maximum(m2 - m1 * m1, 0.0))
  n_half = jnp.maximum(halves @ acc["n"], 1.0)
  out["sink_mass_half"] = (jnp.einsum("hk,k...->h...", halves, acc["sink_mass"]["s1"])
                           / n_half[:, None, None, None] + acc["sink_mass"]["ref"])
  log_v = log_visible(visible)
  counts = visible.sum(-1).astype(jnp.float32)
  out["log_z_slope"] = _slope(log_v, out["log_z"], counts)
  out["log_visible"] = log_v
  out["n_sequences"] = n_all
  out.update(_layer_means(out, visible))
  return out


def _layer_means(den: dict[str, jax.Array], visible: jax.Array) -> dict[str, jax.Array]:
  """The per-layer picture ``[L]``: :data:`LAYER_MEANS` from :func:`finalize`'s per-(layer, head, query) means.

  ``sink_mass_mean_layer`` averages ``a_i0`` over the queries ``i >= 1`` that
  see key 0 (``1 <= i < W`` under a window of ``W`` keys): past-window zeros do
  not dilute it, and query 0, whose only key is 0 (``a_00 = 1``), is left out.
  """
  sees_key0 = (visible[..., :, 0] & (jnp.arange(visible.shape[-1]) >= 1)).astype(jnp.float32)
  sees_key0 = sees_key0 if sees_key0.ndim == 1 else sees_key0[:, None, :]  # [T] or [L, 1, T]
  heads = den["sink_mass"].shape[-2]
  sink = (den["sink_mass"] * sees_key0).sum((-1, -2)) / (heads * sees_key0.sum(-1).reshape(-1))
  return {"log_z_slope_layer": jnp.nanmean(den["log_z_slope"], -1),
          "excess_mean_layer": den["excess"].mean((-1, -2)),
          "entropy_mean_layer": den["entropy"].mean((-1, -2)),
          "max_weight_mean_layer": den["max_weight"].mean((-1, -2)),
          "sink_mass_mean_layer": sink}


# summary.json's per-layer denominator means, each with a jackknife interval (``<name>_ci``).
LAYER_MEANS = ("log_z_slope_layer", "excess_mean_layer", "entropy_mean_layer", "max_weight_mean_layer",
               "sink_mass_mean_layer")
INTERVAL_KEYS = LAYER_MEANS  # the results that carry a jackknife interval


def summarize(den: dict[str, jax.Array], ci: dict) -> dict:
  """summary.json's ``denominators``: the per-head slopes, and :data:`LAYER_MEANS` with their intervals from
  the jackknife summary ``ci`` (keys ``denominators.<name>``), JSON-ready."""
  out = {"log_z_slope": schema.tolist(den["log_z_slope"])}
  for name in LAYER_MEANS:
    out.update(schema.with_ci(ci, f"denominators.{name}", name))
  return {"denominators": out}


def arrays(den: dict[str, jax.Array], ci: dict) -> dict[str, np.ndarray]:
  """stats.npz's denominator arrays: ``log_visible [query]`` and each of :data:`QUANTITIES` (and ``_std``)
  ``[layer, head, query]`` (none has an interval: ``ci`` is unused)."""
  out = {"log_visible": np.asarray(den["log_visible"])}
  for name in QUANTITIES:
    out[name], out[name + "_std"] = np.asarray(den[name]), np.asarray(den[name + "_std"])
  return out
