"""Closed-form ridge probes of log-position, batched over layers.

Target ``y_i = log(1 + i)`` for positions ``i >= min_position`` (default 1:
position 0 is trivially special). Features ``F [B, L, T, p]``: the residual
stream ``h_i^l`` (``p = D``, ``L`` = number of states, e.g. ``L+1``) or any
per-query attention features built by the driver (e.g.
``denominators.query_statistics`` of every head).

Per block of sequences (``seq_id % K``, as in :mod:`leakage`) and layer the
accumulator holds the augmented Gram matrix ``A^T A`` of ``A = [F - ref, 1]``
(its last row and column give ``n`` and the feature sums), ``A^T y`` and
``y^T y``. ``ref`` is the first batch's mean feature per layer and ``y`` is
centred by the constant mean of ``log(1 + i)`` over the included positions;
both keep the float32 sums free of cancellation and change no result.

Fit on one half (even or odd blocks): ``theta = (A^T A + Lambda)^{-1} A^T y``
with ``Lambda = diag(lambda, ..., lambda, 0)`` (intercept unpenalised),
``lambda = ridge * trace(S) / p`` where ``S`` is the fit half's feature
scatter about its own mean (so lambda does not depend on ``ref``; ``1e20``,
which zeroes the weights, where the scatter is below ``1e-10`` per row: constant
features up to float rounding). Held-out ``R^2 = 1 - SSE / SST`` on the other half,
``SSE = theta^T G theta - 2 theta^T b + y^T y`` from that half's stats and
``SST`` about that half's mean of ``y``; cross-fitted: both directions, averaged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.outputs import schema
from abspos_jax.analysis.estimators.fixed_effects import HIGHEST


def rms_normalize(h: jax.Array, eps: float = 1e-12) -> jax.Array:
  """``h / sqrt(mean(h^2) + eps)`` over the last axis: ``[..., D]`` -> ``[..., D]`` (float32).

  What the residual probe reads: each state ``h_i^l`` as the next layer's
  RMSNorm sees it (its gain is a per-feature scale that the probe's weights
  absorb). Pretrained LMs carry massive activations, single positions whose
  norm is 100x the others' (Sun et al. 2024); unnormalised, such rows dominate
  the Gram sums, so the fit and its delete-one-block jackknife swing with the
  block that holds them. Normalised, every row has norm ``sqrt(D)``.
  """
  h = h.astype(jnp.float32)
  return h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)


def init(num_layers: int, dim: int, num_blocks: int) -> dict:
  """Zero accumulator for ``L`` feature sets of dimension ``p = dim``.

  ``gram [L, K, p+1, p+1]``, ``xty [L, K, p+1]``, ``yty [L, K]``, ``ref [L, p]``.
  """
  return dict(gram=jnp.zeros((num_layers, num_blocks, dim + 1, dim + 1), jnp.float32),
              xty=jnp.zeros((num_layers, num_blocks, dim + 1), jnp.float32),
              yty=jnp.zeros((num_layers, num_blocks), jnp.float32),
              ref=jnp.zeros((num_layers, dim), jnp.float32))


def update(acc: dict, features: jax.Array, seq_ids: jax.Array,
           min_position: int = 1) -> dict:
  """Adds a batch: ``features [B, L, T, p]``, ``seq_ids`` int ``[B]`` (block ``seq_id % K``).

  Rows are the positions ``i >= min_position`` (static under ``jit``).
  """
  f = features[:, :, min_position:].astype(jnp.float32)
  y = jnp.log1p(jnp.arange(min_position, features.shape[2], dtype=jnp.float32))
  y = y - y.mean()
  seen = acc["gram"][:, :, -1, -1].sum() > 0
  ref = jnp.where(seen, acc["ref"], f.mean((0, 2)))
  a = jnp.concatenate([f - ref[:, None, :], jnp.ones(f.shape[:-1] + (1,), f.dtype)], -1)
  # Per-sequence Gram matrices [B, L, p+1, p+1], then per-block sums as a contraction with the
  # [B, K] block indicator: one Gram's FLOPs, where masked full-batch Grams would cost K of them.
  num_blocks = acc["yty"].shape[1]
  onehot = jax.nn.one_hot(seq_ids % num_blocks, num_blocks, dtype=jnp.float32)
  per_seq = jnp.einsum("bltp,bltq->blpq", a, a, precision=HIGHEST)
  gram = jnp.einsum("bk,blpq->lkpq", onehot, per_seq, precision=HIGHEST)
  xty = jnp.einsum("bk,bltp,t->lkp", onehot, a, y, precision=HIGHEST)
  n_seq = onehot.sum(0)
  return dict(
      gram=acc["gram"] + gram,
      xty=acc["xty"] + xty,
      yty=acc["yty"] + (n_seq * (y * y).sum())[None, :],
      ref=ref)


def finalize(acc: dict, keep: jax.Array | None = None, ridge: float = 1e-2) -> dict[str, jax.Array]:
  """Cross-fitted held-out R^2 of the kept blocks (jittable; ``keep [K]``, default all).

  Holds one ``jnp.linalg.solve``; run it as one program at a time on the CPU
  (jit it and wait for it): two batched LU solves at once can deadlock XLA
  CPU's intra-op pool (see the comment at the solve).

  Returns ``r2 [L]`` (held out, both directions averaged), ``r2_fit [L]``
  (in sample, both halves averaged), ``ridge_lambda [L]`` (half 0's),
  ``n_fit [L]``, ``n_test [L]`` (rows of half 0 and half 1).
  """
  num_blocks = acc["yty"].shape[1]
  keep = jnp.ones((num_blocks,), jnp.float32) if keep is None else keep
  parity = jnp.arange(num_blocks) % 2
  halves = jnp.stack([keep * (parity == 0), keep * (parity == 1)])  # [2, K]
  g = jnp.einsum("hk,lkpq->hlpq", halves, acc["gram"], precision=HIGHEST)
  b = jnp.einsum("hk,lkp->hlp", halves, acc["xty"], precision=HIGHEST)
  yty = jnp.einsum("hk,lk->hl", halves, acc["yty"], precision=HIGHEST)
  p = g.shape[-1] - 1

  def fit(g_fit: jax.Array, b_fit: jax.Array, ref: jax.Array) -> tuple[jax.Array, jax.Array]:
    n_fit = g_fit[:, -1, -1]
    mean = g_fit[:, :p, -1] / jnp.maximum(n_fit, 1.0)[:, None]
    about_ref = jnp.trace(g_fit[:, :p, :p], axis1=-2, axis2=-1)
    trace = about_ref - n_fit * (mean * mean).sum(-1)
    # sum_i ||f_i||^2 of the features themselves (the Gram holds them about ref)
    raw = about_ref + 2.0 * (ref * g_fit[:, :p, -1]).sum(-1) + n_fit * (ref * ref).sum(-1)
    # Features whose scatter is at float-rounding level are constant: below 1e-10 per row, or below 1e-8
    # of their own mean square (states identical up to rounding, e.g. one repeated token: float32 rounding
    # leaves ~1e-12 of it). A huge lambda zeroes their weights, so that a probe cannot read position from
    # rounding patterns.
    varies = (trace > 1e-10 * n_fit) & (trace > 1e-8 * raw)
    lam = jnp.where(varies, ridge * trace / p, 1e20)
    penalty = jnp.concatenate([jnp.ones((p,)), jnp.zeros((1,))])
    system = g_fit + lam[:, None, None] * jnp.diag(penalty)
    # Jacobi scaling: residual streams mix feature scales over orders of magnitude.
    d = jnp.sqrt(jnp.diagonal(system, axis1=-2, axis2=-1))
    d = jnp.where(d > 0, d, 1.0)
    theta = jnp.linalg.solve(system / (d[:, :, None] * d[:, None, :]), (b_fit / d)[..., None])[..., 0] / d
    return theta, lam

  def r2(theta: jax.Array, g: jax.Array, b: jax.Array, yty: jax.Array) -> jax.Array:
    n = g[:, -1, -1]
    sse = (jnp.einsum("lp,lpq,lq->l", theta, g, theta, precision=HIGHEST)
           - 2.0 * (theta * b).sum(-1) + yty)
    sst = yty - b[:, -1] ** 2 / jnp.maximum(n, 1.0)
    return jnp.where(sst > 0, 1.0 - sse / jnp.where(sst > 0, sst, 1.0), jnp.nan)

  # Both halves in one batched solve: the CPU LU kernel splits its batch over XLA's intra-op pool
  # and blocks a pool thread until the parts are done, so two solves running at once on a 2-thread
  # pool waited on each other forever (gdb: both threads in LuDecomposition, jax 0.10).
  n_layers, size = g.shape[1], g.shape[-1]
  theta, lam = fit(g.reshape(2 * n_layers, size, size), b.reshape(2 * n_layers, size),
                   jnp.concatenate([acc["ref"], acc["ref"]]))
  (theta0, theta1), lam0 = theta.reshape(2, n_layers, size), lam[:n_layers]
  return dict(r2=(r2(theta0, g[1], b[1], yty[1]) + r2(theta1, g[0], b[0], yty[0])) / 2,
              r2_fit=(r2(theta0, g[0], b[0], yty[0]) + r2(theta1, g[1], b[1], yty[1])) / 2,
              ridge_lambda=lam0, n_fit=g[0, :, -1, -1], n_test=g[1, :, -1, -1])


# The three probes of the analysis (accumulator names) and their summary.json names.
PROBES = {"probe_resid": "residual_r2", "probe_attn": "attention_r2", "probe_attn_raw": "attention_raw_r2"}


def summarize(fin: dict[str, jax.Array], ci: dict) -> dict:
  """summary.json's ``probes``: each probe's held-out R^2 per layer with its interval (``ci`` keys
  ``<probe>.r2``)."""
  out = {}
  for probe, name in PROBES.items():
    out.update(schema.with_ci(ci, f"{probe}.r2", name))
  return {"probes": out}


def arrays(fin: dict[str, jax.Array], ci: dict) -> dict[str, np.ndarray]:
  """stats.npz's probe arrays: ``<probe>_r2 [layer]``."""
  return {f"{probe}_r2": np.asarray(ci["value"][f"{probe}.r2"]) for probe in PROBES}
