"""Two-way fixed effects on the (query, offset) cells, from per-offset and per-query sums.

Cells are the pairs ``(i, j)`` of one cell mask (query ``i``, key ``j <= i``);
the offset is ``d = i - j``. Cells are addressed in *skew* coordinates
``(i, d)``: cell ``(i, d)`` is key ``j = i - d``. For a pair quantity ``X``
two additive models are fit by OLS over observations (every sequence
contributes one observation to every cell):

* model A (two-way): ``X_ij = alpha_{i-j} + beta_i``
* model B (offset only): ``X_ij = alpha_{i-j}``

With the dummy design ``D`` (``T`` offset columns, then ``T`` query columns),
the normal equations are ``G coef = D^T x / n`` with ``G = D^T D``
(``[2T, 2T]``, the same for every sequence) and ``D^T x`` the *per-offset and
per-query sums* of the observations. So a fit needs ``[T]`` sums, never a
``[T, T]`` grid, and its residual sum of squares needs only those plus the
sums of squares: for any coefficients ``c`` (offsets first) and ``n`` sequences,

    SSE(c) = sum x^2 - 2 c . D^T x + n c^T G c.

``G`` is never formed. Every mask the analysis meets (causal, sliding window,
and either with key 0 taken out for queries ``i >= 1``) gives query ``i`` the
cells of offsets ``d < n_i``, with ``n_i`` non-decreasing in ``i``, so with
``S [T, T]`` the query-by-offset incidence (``S_id = [d < n_i]``),

    G = [[diag(o), S^T], [S, diag(n)]],   o_d = #{i : n_i > d},

and ``G c`` costs ``O(T)``: ``S alpha`` is a prefix sum of ``alpha``, ``S^T
beta`` a suffix sum of ``beta``. The normal equations are solved by conjugate
gradients preconditioned with ``diag(G) = (o, n)`` (Jacobi), from zero, to a
relative residual ``||D^T x / n - G c|| <= TOLERANCE ||D^T x / n||`` (about
ten iterations at any ``T`` for these layouts; at most ``MAX_ITERATIONS``),
``O(T)`` time and memory per mask and iteration. ``G`` is singular along
``(1 on the used offsets, -1 on the queries)`` (a shared constant moved from
the query to the offset effects) and zero on offsets no cell has; removing
the solution's component along that direction, with zero on the unused
offsets, gives the minimum-norm solution ``G^+ D^T x / n``.

``alpha`` and ``beta`` are identified only up to that shared constant; the
centred query effect ``phi_i = beta_i - sum_i |C(i)| beta_i / n_cells``
(cell-weighted: query ``i`` counts ``|C(i)|`` times, ``C(i)`` its cells) is
unique, since offset 0 links every query (each query sees itself).

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
  """Precomputed design of one cell mask or a stack of them (leading axes ``...``).

  Fields (``...`` is empty for one mask, ``[L]`` per layer, ``[L, H]`` per head),
  all ``O(T)`` per mask: the ``[T, T]`` masks they stand for are rebuilt a
  block of queries at a time by :func:`row_masks`.

    key_count: float32 ``[..., T]``, ``n(i)``: the keys query ``i`` normalises over
      (its nearest ``n(i)`` offsets; the cells unless ``make_design`` got ``keys``).
    ref_count: float32 ``[..., T]``, references per ``n = d + 1``: the queries ``p``
      that normalise over their nearest ``n`` offsets at least, none of them key 0
      (``p - d >= 1``); where no ``p`` qualifies (``n = T`` under a causal mask)
      the last query ``p = T - 1`` is used (``ref_valid`` of :func:`row_masks`).
    query_count: float32 ``[..., T]``, ``|C(i)|``: query ``i``'s cells are its nearest
      ``|C(i)|`` offsets.
    offset_count: float32 ``[..., T]``, cells with offset ``d``.
    n_cells: float32 ``[...]``.
    first_query: int32 ``[..., T]``, the first query with a cell at offset ``d``
      (``#{i : n_i <= d}``; ``T`` where none): ``S^T`` reads suffix sums there.
    ref_last: bool ``[..., T]``, ``ref_valid``'s last row (query ``T - 1``).
  """

  key_count: jax.Array
  ref_count: jax.Array
  query_count: jax.Array
  offset_count: jax.Array
  n_cells: jax.Array
  first_query: jax.Array
  ref_last: jax.Array


def _skew_mask(mask: np.ndarray, name: str) -> np.ndarray:
  """Checked skew coordinates ``(i, d)`` of a causal mask whose keys are the nearest offsets of each query."""
  t = mask.shape[-1]
  if mask.shape != (t, t):
    raise ValueError(f"{name} must be [T, T], got {mask.shape}")
  if np.any(mask & ~np.tri(t, dtype=bool)):
    raise ValueError(f"{name} must be causal (keys j <= i only)")
  if not np.diagonal(mask).all():
    raise ValueError(f"every query must see itself (the diagonal of {name} must be True)")
  # sk[i, d] = mask[i, i - d] (False for d > i) by :func:`skew`'s strided copy: bool [T, 2T] at most, where
  # fancy indexing would build int64 [T, T] indices (512 MiB each at 8,192 tokens).
  z = np.zeros((t, 2 * t), bool)
  z[:, :t] = mask[:, ::-1]
  return np.ascontiguousarray(z.reshape(-1)[:t * (2 * t - 1)].reshape(t, 2 * t - 1)[:, t - 1:])


def _design_arrays(visible: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, ...]:
  """NumPy fields of ``FEDesign`` for one ``[T, T]`` cell mask and its keys."""
  skew_valid = _skew_mask(visible, "visible")
  key_valid = _skew_mask(keys, "keys")
  t = visible.shape[-1]
  i = np.arange(t)[:, None]
  d = np.arange(t)[None, :]
  if np.any(visible & ~keys):
    raise ValueError("every cell must be a key of its query (visible within keys)")
  # The keys of each query must be its nearest offsets (a prefix d < n(i)), so that a query with n keys
  # and a reference reading its nearest n offsets see the same kind of window.
  query_count = skew_valid.sum(1)
  key_count = key_valid.sum(1)
  if not (key_valid == (d < key_count[:, None])).all():
    raise ValueError("the keys of every query must be contiguous and end at the query itself")
  ref_valid = key_valid & (d < i)
  empty = ~ref_valid.any(0)
  used = np.isin(np.arange(t), key_count - 1)
  ref_valid[t - 1, empty & used & key_valid[t - 1]] = True
  ref_count = ref_valid.sum(0).astype(np.float64)
  offset_count = skew_valid.sum(0).astype(np.float64)
  if not (skew_valid == (d < query_count[:, None])).all() or np.any(np.diff(query_count) < 0):
    raise ValueError("the cells of every query must be its nearest offsets, as many for a later query as for an "
                     "earlier one (causal or sliding-window masks, optionally without key 0)")
  first_query = np.searchsorted(query_count, np.arange(t), side="right")
  return (key_count.astype(np.float32), ref_count.astype(np.float32), query_count.astype(np.float32),
          offset_count.astype(np.float32), np.float32(visible.sum()), first_query.astype(np.int32),
          ref_valid[t - 1].copy())


def make_design(visible: np.ndarray | jax.Array, keys: np.ndarray | jax.Array | None = None) -> FEDesign:
  """Builds the design of a cell mask ``[T, T]`` or a stack ``[L, T, T]`` / ``[L, H, T, T]``.

  ``keys`` (same shape or broadcastable): the keys each query's softmax
  normalises over, when the cells are fewer (``sink_ablate``'s reference pass
  measures the cells without key 0 while the model still normalises over it);
  default the cells. Runs on the host, ``O(T^2)`` per distinct mask for its
  checks; the design itself is ``O(T)`` arrays per mask.
  """
  vis = np.asarray(visible, dtype=bool)
  if vis.ndim not in (2, 3, 4):
    raise ValueError(f"visible must be [T, T], [L, T, T] or [L, H, T, T], got {vis.shape}")
  key = vis if keys is None else np.broadcast_to(np.asarray(keys, dtype=bool), vis.shape)
  t = vis.shape[-1]
  lead = vis.shape[:-2]
  cache: dict[bytes, tuple[np.ndarray, ...]] = {}  # local/global and ablated/kept patterns repeat
  flat, flat_keys = vis.reshape((-1, t, t)), key.reshape((-1, t, t))
  per_mask = []
  for v, k in zip(flat, flat_keys):
    tag = v.tobytes() + k.tobytes()
    if tag not in cache:
      cache[tag] = _design_arrays(v, k)
    per_mask.append(cache[tag])
  fields = [np.stack(f).reshape(lead + f[0].shape) for f in zip(*per_mask)]
  return FEDesign(*map(jnp.asarray, fields))


def layer_mask(visible: jax.Array) -> jax.Array:
  """``[T, T]`` or ``[L, T, T]`` mask, broadcastable to ``[L, H, T, T]``."""
  return visible if visible.ndim == 2 else visible[..., None, :, :]


def skew(x: jax.Array, start: int | jax.Array = 0) -> jax.Array:
  """``x[..., r, j] -> y[..., r, d] = x[..., r, start + r - d]``: ``[..., R, W] -> [..., R, W]``.

  Rows ``r`` are the queries ``i = start + r`` (all ``T`` of them from ``start
  = 0`` when ``R = T``), columns the keys ``0 .. W - 1`` (``W = T``, or fewer
  when the queries see no key past ``W - 1``). Meaningful on the cells only
  (``design.skew_valid``, :func:`row_masks`); callers mask the rest. A
  strided copy rather than a gather (1.6x faster on CPU): with the keys
  reversed, ``x'[r, k] = x[r, T-1-k]``, padded to rows of ``2T`` and re-read
  in rows of ``2T - 1``, row ``r`` is shifted right by ``r``, so column
  ``T - 1 - start + d`` holds ``x'[r, T-1-start-r+d] = x[r, start + r - d]``.
  """
  t, rows = x.shape[-1], x.shape[-2]
  lead = x.shape[:-2]
  z = jnp.pad(jnp.flip(x, -1), [(0, 0)] * (x.ndim - 1) + [(0, t)])
  z = z.reshape(lead + (2 * t * rows,))[..., :rows * (2 * t - 1)].reshape(lead + (rows, 2 * t - 1))
  return jax.lax.dynamic_slice_in_dim(z, t - 1 - start, t, axis=-1)


def row_masks(design: FEDesign, start: int | jax.Array, size: int, width: int | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``skew_valid``, ``key_valid`` and ``ref_valid`` at queries ``start .. start + size - 1`` and offsets
  ``0 .. width - 1`` (default all ``T``): bool ``[size, width]`` each, from ``[T]`` fields of one mask's design
  (so a block of rows costs ``O(size T)``, not the ``[T, T]``)."""
  t = design.query_count.shape[-1]
  i = start + jnp.arange(size)[:, None]
  d = jnp.arange(width or t)[None, :]
  rows = lambda x: jax.lax.dynamic_slice_in_dim(x, start, size)[:, None]  # noqa: E731
  cells, keys = d < rows(design.query_count), d < rows(design.key_count)
  return cells, keys, jnp.where(i == t - 1, design.ref_last[None, :width or t], keys & (d < i))


def cell_mean_of_query_function(design: FEDesign, f: jax.Array) -> jax.Array:
  """Mean over cells of ``f(i)``: ``sum_i |C(i)| f_i / n_cells``; ``[..., T] -> [...]``."""
  return jnp.sum(design.query_count * f, -1) / design.n_cells


def query_function_effect(design: FEDesign, f: jax.Array) -> jax.Array:
  """``phi`` of ``X_ij = f(i)``, which is exactly ``f - cell_mean(f)``; ``[..., T]``."""
  return f - cell_mean_of_query_function(design, f)[..., None]


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
  """``x[..., index_j]`` for each ``j``, broadcasting the leading axes of ``x [..., T+1]`` and ``index [..., T]``."""
  lead = jnp.broadcast_shapes(x.shape[:-1], index.shape[:-1])
  return jnp.take_along_axis(jnp.broadcast_to(x, lead + x.shape[-1:]),
                             jnp.broadcast_to(index, lead + index.shape[-1:]), -1)


def _prefix_at(x: jax.Array, index: jax.Array) -> jax.Array:
  """``sum_{k < index_j} x_k`` for each ``j``: ``x [..., T]``, ``index [..., T]`` int in ``[0, T]``."""
  return _take(jnp.concatenate([jnp.zeros_like(x[..., :1]), jnp.cumsum(x, -1)], -1), index)


def _suffix_at(x: jax.Array, index: jax.Array) -> jax.Array:
  """``sum_{k >= index_j} x_k`` for each ``j`` (``index`` in ``[0, T]``; ``T`` gives exactly 0)."""
  return _take(jnp.concatenate([jnp.cumsum(x[..., ::-1], -1)[..., ::-1], jnp.zeros_like(x[..., :1])], -1), index)


def query_sums(design: FEDesign, alpha: jax.Array) -> jax.Array:
  """``S alpha``: per query, the sum over its offsets ``d < n_i``; ``[..., T]``."""
  return _prefix_at(alpha, design.query_count.astype(jnp.int32))


def offset_sums(design: FEDesign, beta: jax.Array) -> jax.Array:
  """``S^T beta``: per offset, the sum over the queries that have it; ``[..., T]``."""
  return _suffix_at(beta, design.first_query)


def gram_times(design: FEDesign, coef: jax.Array) -> jax.Array:
  """``G coef``: ``[..., 2T] -> [..., 2T]`` in ``O(T)``."""
  t = coef.shape[-1] // 2
  alpha, beta = coef[..., :t], coef[..., t:]
  return jnp.concatenate([design.offset_count * alpha + offset_sums(design, beta),
                          query_sums(design, alpha) + design.query_count * beta], -1)


TOLERANCE = 1e-6  # relative residual of the fixed-effects solve
MAX_ITERATIONS = 100


def _solve(design: FEDesign, rhs: jax.Array) -> jax.Array:
  """The minimum-norm solution of ``G coef = rhs`` (``rhs [..., 2T]`` in the range of ``G``).

  Jacobi-preconditioned conjugate gradients from zero, every mask of the
  batch until each meets ``TOLERANCE`` (or ``MAX_ITERATIONS``), then the null
  direction removed (module docstring).
  """
  used = design.offset_count > 0
  diag = jnp.concatenate([jnp.where(used, design.offset_count, 1.0), design.query_count], -1)
  dot = lambda a, b: (a * b).sum(-1, keepdims=True)  # noqa: E731

  def body(state):
    x, r, p, rz, k = state
    gp = gram_times(design, p)
    pgp = dot(p, gp)
    step = jnp.where(pgp > 0, rz / jnp.where(pgp > 0, pgp, 1.0), 0.0)
    x, r = x + step * p, r - step * gp
    z = r / diag
    rz_new = dot(r, z)
    p = z + jnp.where(rz > 0, rz_new / jnp.where(rz > 0, rz, 1.0), 0.0) * p
    return x, r, p, rz_new, k + 1

  def more(state):
    _, r, _, _, k = state
    return (k < MAX_ITERATIONS) & jnp.any(jnp.sqrt(dot(r, r)) > goal)

  null = jnp.concatenate([used.astype(rhs.dtype), -jnp.ones_like(design.query_count)], -1)
  rhs = rhs - dot(rhs, null) / dot(null, null) * null  # into the range of G: rounding can leave it just outside
  goal = TOLERANCE * jnp.sqrt(dot(rhs, rhs))
  z0 = rhs / diag
  x = jax.lax.while_loop(more, body, (jnp.zeros_like(rhs), rhs, z0, dot(rhs, z0), 0))[0]
  return x - dot(x, null) / dot(null, null) * null


def fit_two_way(design: FEDesign, offset_means: jax.Array, query_means: jax.Array) -> jax.Array:
  """Model A from ``D^T x / n`` (``offset_means, query_means [..., T]``): the minimum-norm coefficients
  ``G^+ D^T x / n``, ``[..., 2T]``.

  :func:`_solve`, then one step of iterative refinement (the same solve on
  the residual, added): in float32 conjugate gradients stall near a relative
  residual of 1e-7, and run on past it they drift; the refinement takes the
  coefficients to float32 rounding (about 1e-5 of their size against a
  float64 solve up to T = 2,048: benchmarks/fixed_effects_solve.py).
  """
  rhs = jnp.concatenate([offset_means, query_means], -1)
  coef = _solve(design, rhs)
  return coef + _solve(design, rhs - gram_times(design, coef))


def fit_offset_only(design: FEDesign, offset_means: jax.Array) -> jax.Array:
  """Model B: ``alpha_d`` = mean over the offset-``d`` cells (0 where none), as ``[..., 2T]`` coefficients."""
  alpha = offset_means / jnp.maximum(design.offset_count, 1.0)
  return jnp.concatenate([alpha, jnp.zeros_like(alpha)], -1)


def query_effect(design: FEDesign, coef: jax.Array) -> jax.Array:
  """Centred query effect ``phi [..., T]`` of two-way coefficients ``[..., 2T]``."""
  t = coef.shape[-1] // 2
  return query_function_effect(design, coef[..., t:])


def sse(design: FEDesign, coef: jax.Array, offset_sums: jax.Array, query_sums: jax.Array,
        sum_squares: jax.Array, n: jax.Array) -> jax.Array:
  """``sum_obs (x - pred)^2`` of ``n`` sequences from their sums: ``SSE = sum x^2 - 2 c . D^T x + n c^T G c``.

  ``coef [..., 2T]``; ``offset_sums, query_sums [..., T]`` and ``sum_squares [...]``
  are the sums of ``x`` and ``x^2`` over the observations. Returns ``[...]``.
  """
  rhs = jnp.concatenate([offset_sums, query_sums], -1)
  return sum_squares - 2.0 * (coef * rhs).sum(-1) + n * (coef * gram_times(design, coef)).sum(-1)
