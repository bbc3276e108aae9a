"""Two-way fixed-effects projection on the (query, offset) cell grid.

Cells are the visible pairs ``(i, j)`` of one attention mask (query ``i``, key
``j <= i``); the offset is ``d = i - j``. For a pair quantity ``X`` two
additive models are fit by OLS:

* model A (two-way): ``X_ij = alpha_{i-j} + beta_i``
* model B (offset only): ``X_ij = alpha_{i-j}``

Every sequence contributes one observation to every visible cell, so OLS on the
pooled observations equals OLS on the cell means ``M_ij`` (the normal equations
of the pooled fit are ``n`` times those of the cell-mean fit). The fit is then
a fixed linear map of ``M``: with the dummy-coded design ``D`` (``T`` offset
columns, ``T`` query columns) the coefficients are ``G^+ D^T M`` with
``G = D^T D`` of shape ``[2T, 2T]``, precomputed once per mask in float64.

``alpha`` and ``beta`` are identified only up to a shared constant; the
centred query effect ``phi_i = beta_i - sum_cells beta_{i(c)} / n_cells`` (a
cell-weighted mean: query ``i`` counts ``|V(i)|`` times) is unique whenever the
bipartite graph of queries and offsets is connected, which holds for every mask
that shows each query itself (offset 0 links all queries). ``make_design``
checks this.

This module also holds the held-out R^2 machinery (per-cell sufficient
statistics split into two halves by sequence id) that ``leakage`` builds on.
Arrays are float32; ``T`` is the sequence length.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# f32 matmuls on GPU/TPU default to reduced precision (TF32 / bf16 passes).
HIGHEST = jax.lax.Precision.HIGHEST


class FEDesign(NamedTuple):
  """Precomputed design of one mask, or a stack of masks (leading axes ``...``).

  Fields (``...`` is empty for one mask, ``[L]`` for one mask per layer):
    visible: bool ``[..., T, T]``, the cells.
    diff_index: int32 ``[..., T, T]``, ``clip(i - k, 0, T-1)``: the offset of
      cell ``(i, j=k)``, and the key of skew cell ``(i, d=k)``.
    skew_valid: bool ``[..., T, T]``, ``(i, d)`` is a visible cell.
    query_count: float32 ``[..., T]``, ``|V(i)|``.
    offset_count: float32 ``[..., T]``, cells with offset ``d``.
    n_cells: float32 ``[...]``.
    normal_pinv: float32 ``[..., 2T, 2T]``, ``G^+`` (offset block first).
  """

  visible: jax.Array
  diff_index: jax.Array
  skew_valid: jax.Array
  query_count: jax.Array
  offset_count: jax.Array
  n_cells: jax.Array
  normal_pinv: jax.Array


def _design_arrays(visible: np.ndarray) -> tuple[np.ndarray, ...]:
  """NumPy fields of ``FEDesign`` for one ``[T, T]`` mask."""
  t = visible.shape[-1]
  if visible.shape != (t, t):
    raise ValueError(f"visible must be [T, T], got {visible.shape}")
  if np.any(visible & ~np.tri(t, dtype=bool)):
    raise ValueError("visible must be causal (keys j <= i only)")
  if not visible.any(axis=1).all():
    raise ValueError("every query needs at least one visible key")
  i = np.arange(t)[:, None]
  d = np.arange(t)[None, :]
  diff_index = np.clip(i - d, 0, t - 1)
  skew_valid = (i - d >= 0) & visible[np.broadcast_to(i, (t, t)), diff_index]
  query_count = visible.sum(1).astype(np.float64)
  offset_count = skew_valid.sum(0).astype(np.float64)
  sv = skew_valid.astype(np.float64)
  gram = np.block([[np.diag(offset_count), sv.T], [sv, np.diag(query_count)]])
  w, v = np.linalg.eigh(gram)
  keep = w > 1e-8 * w.max()  # nonzero eigenvalues are >= ~1 for causal masks
  # Null space: the shared constant plus one direction per unused offset.
  expected_rank = 2 * t - 1 - int((offset_count == 0).sum())
  if keep.sum() != expected_rank:
    raise ValueError("query effects are not identified: the (query, offset) "
                     "graph of this mask is disconnected")
  pinv = (v[:, keep] / w[keep]) @ v[:, keep].T
  return (visible, diff_index.astype(np.int32), skew_valid,
          query_count.astype(np.float32), offset_count.astype(np.float32),
          np.float32(visible.sum()), pinv.astype(np.float32))


def make_design(visible: np.ndarray | jax.Array) -> FEDesign:
  """Builds the design of a mask ``[T, T]`` or a stack of masks ``[L, T, T]``.

  Runs on the host (float64 eigendecomposition of each distinct mask). The
  fit functions below take the design of one mask; map them over a stack with
  ``jax.vmap`` (as ``leakage.finalize`` does).
  """
  vis = np.asarray(visible, dtype=bool)
  if vis.ndim == 2:
    return FEDesign(*map(jnp.asarray, _design_arrays(vis)))
  if vis.ndim != 3:
    raise ValueError(f"visible must be [T, T] or [L, T, T], got {vis.shape}")
  cache: dict[bytes, tuple[np.ndarray, ...]] = {}  # local/global patterns repeat
  for v in vis:
    if v.tobytes() not in cache:
      cache[v.tobytes()] = _design_arrays(v)
  per_layer = [cache[v.tobytes()] for v in vis]
  return FEDesign(*(jnp.asarray(np.stack(f)) for f in zip(*per_layer)))


def layer_mask(visible: jax.Array) -> jax.Array:
  """``[T, T]`` or ``[L, T, T]`` mask, broadcastable to ``[L, H, T, T]``."""
  return visible if visible.ndim == 2 else visible[..., None, :, :]


def design_sums(design: FEDesign, x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``D^T X``: sums of ``x [..., T, T]`` over visible cells per offset and per query.

  Returns ``(offset_sums [..., T], query_sums [..., T])``.
  """
  x = jnp.where(design.visible, x, 0.0)
  query_sums = x.sum(-1)
  skew = jnp.take_along_axis(x, jnp.broadcast_to(design.diff_index, x.shape), -1)
  offset_sums = jnp.where(design.skew_valid, skew, 0.0).sum(-2)
  return offset_sums, query_sums


def cell_mean_of_query_function(design: FEDesign, f: jax.Array) -> jax.Array:
  """Mean over visible cells of ``f(i)``: ``sum_i |V(i)| f_i / n_cells``; ``[..., T] -> [...]``."""
  return jnp.sum(design.query_count * f, -1) / design.n_cells


def query_function_effect(design: FEDesign, f: jax.Array) -> jax.Array:
  """``phi`` of ``X_ij = f(i)``, which is exactly ``f - cell_mean(f)``; ``[..., T]``."""
  return f - cell_mean_of_query_function(design, f)[..., None]


def _two_way_coef(design: FEDesign, m: jax.Array) -> jax.Array:
  """Minimum-norm coefficients ``G^+ D^T m``: ``[..., T, T] -> [..., 2T]`` (offsets first)."""
  offset_sums, query_sums = design_sums(design, m)
  rhs = jnp.concatenate([offset_sums, query_sums], -1)
  return jnp.einsum("...k,jk->...j", rhs, design.normal_pinv, precision=HIGHEST)


def _two_way_fitted(design: FEDesign, coef: jax.Array) -> jax.Array:
  """``alpha_{i-j} + beta_i`` on the visible cells, 0 elsewhere: ``[..., 2T] -> [..., T, T]``."""
  t = coef.shape[-1] // 2
  fitted = jnp.take(coef[..., :t], design.diff_index, axis=-1) + coef[..., t:, None]
  return jnp.where(design.visible, fitted, 0.0)


def fit_two_way(design: FEDesign, m: jax.Array) -> dict[str, jax.Array]:
  """Fits model A to cell means ``m [..., T, T]``.

  Returns ``alpha [..., T]`` (offset effects, minimum-norm solution),
  ``beta [..., T]`` (query effects, same), ``phi [..., T]`` (centred query
  effect, identified) and ``fitted [..., T, T]`` (0 off the visible cells).
  """
  t = m.shape[-1]
  coef = _two_way_coef(design, m)
  # One step of iterative refinement: in float32 the sums in D^T m are much
  # larger than the coefficients (error ~1e-4 at T = 128); refitting the
  # residual brings it to ~1e-6.
  coef = coef + _two_way_coef(design, m - _two_way_fitted(design, coef))
  alpha, beta = coef[..., :t], coef[..., t:]
  return dict(alpha=alpha, beta=beta, phi=query_function_effect(design, beta),
              fitted=_two_way_fitted(design, coef))


def fit_offset_only(design: FEDesign, m: jax.Array) -> dict[str, jax.Array]:
  """Fits model B to cell means ``m [..., T, T]``: ``alpha_d`` = mean over offset-``d`` cells.

  Returns ``alpha [..., T]`` (0 for offsets with no cell) and ``fitted [..., T, T]``.
  """
  offset_sums, _ = design_sums(design, m)
  alpha = offset_sums / jnp.maximum(design.offset_count, 1.0)
  fitted = jnp.take(alpha, design.diff_index, axis=-1)
  return dict(alpha=alpha, fitted=jnp.where(design.visible, fitted, 0.0))


# --- Held-out sufficient statistics ------------------------------------------
#
# acc = {s1, s2: [*lead, 2, T, T], n: [2], ref: [*lead, T, T]}. Half k holds the
# sequences with seq_id % 2 == k (k = 0 fits, k = 1 scores); s1 / s2 are the
# per-cell sums of (x - ref) and (x - ref)^2, n the number of sequences. ref is
# the cell mean of the first batch seen (all its sequences), fixed afterwards:
# it keeps sums of squares free of cancellation when a cell's mean is large
# against its spread, and every result below is exactly invariant to it.


def heldout_init(shape: tuple[int, ...]) -> dict[str, jax.Array]:
  """Zero accumulator for a pair quantity of shape ``[*lead, T, T]`` per sequence."""
  *lead, t, t2 = shape
  return dict(s1=jnp.zeros((*lead, 2, t, t2), jnp.float32),
              s2=jnp.zeros((*lead, 2, t, t2), jnp.float32),
              n=jnp.zeros((2,), jnp.float32),
              ref=jnp.zeros(shape, jnp.float32))


def heldout_update(acc: dict[str, jax.Array], x: jax.Array, visible: jax.Array,
                   seq_ids: jax.Array) -> dict[str, jax.Array]:
  """Adds a batch ``x [B, *lead, T, T]``.

  ``visible`` bool broadcastable to ``[*lead, T, T]``; ``seq_ids`` int ``[B]``.
  """
  x = x.astype(jnp.float32)
  seq_half = seq_ids % 2
  onehot = jax.nn.one_hot(seq_half, 2, dtype=jnp.float32)

  def first_batch_mean() -> jax.Array:
    return jnp.einsum("b,b...->...", jnp.full((x.shape[0],), 1.0 / x.shape[0], jnp.float32),
                      jnp.where(visible, x, 0.0), precision=HIGHEST)

  ref = jax.lax.cond(acc["n"].sum() > 0, lambda: acc["ref"], first_batch_mean)

  # One sequence at a time: each step reads x[b] once and adds y and y^2 in place into its half
  # (the sums stay in cache), where sums over the batch axis as contractions or reductions make
  # several passes over [B, *lead, T, T]: ~4x faster on CPU (docs/benchmarks.md).
  def add(b: jax.Array, sums: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    y = jnp.where(visible, x[b] - ref, 0.0)
    return sums[0].at[seq_half[b]].add(y), sums[1].at[seq_half[b]].add(y * y)

  zeros = jnp.zeros((2,) + x.shape[1:], jnp.float32)
  s1, s2 = jax.lax.fori_loop(0, x.shape[0], add, (zeros, zeros))
  return dict(s1=acc["s1"] + jnp.moveaxis(s1, 0, -3), s2=acc["s2"] + jnp.moveaxis(s2, 0, -3),
              n=acc["n"] + onehot.sum(0), ref=ref)


def total_sum_squares(s1: jax.Array, s2: jax.Array, n: jax.Array, ref: jax.Array,
                      cells: jax.Array) -> jax.Array:
  """``sum (x - xbar)^2`` over the observations in ``cells``, ``xbar`` their grand mean.

  ``s1, s2, ref [..., T, T]`` are sums of ``x - ref`` and its square over ``n``
  sequences; ``cells`` bool broadcastable to them. Writing ``u_c = ref_c - xbar``:
  ``TSS = sum_c [s2_c + 2 u_c s1_c + n u_c^2]``. Returns ``[...]``.
  """
  cells = jnp.broadcast_to(cells, s1.shape)
  n_cells = cells.sum((-2, -1))
  total = jnp.where(cells, s1 + n * ref, 0.0).sum((-2, -1))
  xbar = total / jnp.maximum(n * n_cells, 1.0)
  u = ref - xbar[..., None, None]
  return jnp.where(cells, s2 + 2.0 * u * s1 + n * u * u, 0.0).sum((-2, -1))


def pooled_cell_means(acc: dict[str, jax.Array]) -> jax.Array:
  """Cell means over both halves, ``[*lead, T, T]``."""
  return acc["s1"].sum(-3) / jnp.maximum(acc["n"].sum(), 1.0) + acc["ref"]


def heldout_r2(design: FEDesign, acc: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """Held-out R^2 of models A and B: fit on half 0's cell means, score half 1.

  ``SSE = sum_cells [S2 - 2 q S1 + n q^2]`` with ``q = pred - ref`` and the
  test half's ref-centred sums ``S1, S2``; ``SST`` is the test half's total sum
  of squares about its grand mean. Returns ``two_way``, ``offset`` (``[*lead]``,
  NaN when a half is empty or ``SST = 0``).
  """
  n_fit, n_test = acc["n"][0], acc["n"][1]
  fit_mean = acc["s1"][..., 0, :, :] / jnp.maximum(n_fit, 1.0) + acc["ref"]
  s1, s2 = acc["s1"][..., 1, :, :], acc["s2"][..., 1, :, :]
  sst = total_sum_squares(s1, s2, n_test, acc["ref"], design.visible)
  ok = (n_fit > 0) & (n_test > 0) & (sst > 0)

  def r2(pred: jax.Array) -> jax.Array:
    q = pred - acc["ref"]
    sse = jnp.where(design.visible, s2 - 2.0 * q * s1 + n_test * q * q, 0.0)
    return jnp.where(ok, 1.0 - sse.sum((-2, -1)) / jnp.where(ok, sst, 1.0), jnp.nan)

  return dict(two_way=r2(fit_two_way(design, fit_mean)["fitted"]),
              offset=r2(fit_offset_only(design, fit_mean)["fitted"]))
