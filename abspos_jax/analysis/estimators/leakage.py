"""Absolute-position leakage of logits and log-weights, and its causal-mask / residual-stream split (v2).

Per layer ``l`` and head ``h`` the pair quantities are the logits ``s_ij`` and
the log-weights ``log a_ij = s_ij - log Z_i`` on the cells (the visible keys).
Everything is estimated from per-offset and per-query sums over observations
(one observation per (sequence, i, j)), accumulated per *block* of sequences
(block ``seq_id % K``; half ``block % 2``) so that cross-fitting and the
jackknife intervals of :mod:`abspos_jax.analysis.estimators.intervals` need no second
pass. Accumulators are ``[K, L, H, T]``; nothing of shape ``[T, T]`` is kept.

**Held-out leakage** of ``X`` in {s, loga}: ``R^2_A - R^2_B`` of the two-way
and offset-only fixed-effects models (:mod:`fixed_effects`), fit on one half
and scored on the other, both directions averaged. Pooled per layer and
overall as the mean over heads.

**Mask-only normaliser.** ``log Z^mask(n) = mean_{p in R(n)} [logsumexp_{d<n}
s_{p,p-d} - s_{p,p}]`` over the reference queries ``R(n)`` whose nearest ``n``
offsets are keys and exclude key 0 (``fixed_effects.FEDesign.ref_count``;
``p = T - 1`` where none qualifies). With ``n(i)`` the keys query ``i``
normalises over (``FEDesign.key_count``, the cells but in ``sink_ablate``'s
reference pass) split
``log Z_i = log Z^mask(n(i)) + R_i`` and, with centred query effects ``phi``
(all linear in the sums; the fit of a query-only function is exact)::

    phi_loga = phi_s - phi_zmask - phi_zres
    mask part  m = -phi_zmask          residual part  r = phi_s - phi_zres

**Cross-fitted moments** over a set of queries ``S`` (all, and ``early``:
``1 <= i < early_max``), cell-weighted (query ``i`` counts ``|C(i)|`` times),
each effect re-centred on ``S``, effects ``^0`` from half 0 and ``^1`` from
half 1: ``Cov(a, b) = (<a^0 b^1> + <a^1 b^0>) / 2``, so noise that is
independent between the halves adds nothing on average.

* ``var_phi = Cov(phi_loga, phi_loga)``, ``cov_mask = Cov(phi_loga, m)``,
  ``cov_res = Cov(phi_loga, r)`` (nats^2; ``cov_mask + cov_res = var_phi``);
  ``var_mask = Cov(m, m)``, ``var_res = Cov(r, r)``: each part's own size
  (``var_res`` is 0 exactly when the residual stream carries no absolute
  position, whatever the sign of its share);
* ``var_total``: ``Var(log a)`` over all observations of ``S``;
* ``leakage_share = var_phi / var_total``; ``comp_mask, comp_res = cov / var_total``;
  ``share_mask = cov_mask / var_phi``, ``share_res = cov_res / var_phi`` (sum to 1).

Pooled per layer (``_layer``) and overall (``_overall``) by averaging the
moments over heads before taking ratios.

Numerics: sums are of ``x - ref_d`` with ``ref`` an offset profile taken
from the first sequence seen (both models absorb any offset function, so no
fit or R^2 depends on it; it keeps sums of squares free of cancellation when
the logits follow a steep offset profile). The cumulative ``logsumexp`` of
the normaliser is a cumulative sum of the weights (:func:`sequence_sums`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import denominators, fixed_effects as fe

from abspos_jax.analysis.passes import accumulators

from abspos_jax.analysis.outputs import schema

SUMS = ("os", "qs", "qq", "qr")  # per offset, per query, per query of y^2, per query of y * ref
# What block_sums returns per query and per offset.
ROWS = tuple(f"{x}_{k}" for x in ("s", "loga") for k in SUMS[1:]) + denominators.QUANTITIES
OFFSETS = ("s_os", "loga_os", "zm")
_BASE = ("var_phi", "var_total", "cov_mask", "cov_res", "var_mask", "var_res")
_RATIOS = {"leakage_share": ("var_phi", "var_total"),
           "comp_mask": ("cov_mask", "var_total"),
           "comp_res": ("cov_res", "var_total"),
           "share_mask": ("cov_mask", "var_phi"),
           "share_res": ("cov_res", "var_phi")}


def _div(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a / b``, NaN where ``b`` is not positive."""
  return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), jnp.nan)


def init(num_layers: int, num_heads: int, seq_len: int, num_blocks: int) -> dict:
  """Zero accumulator.

  For ``X`` in {s, loga}: ``X = {os, qs, qq, qr: [K, L, H, T], ref: [L, H, T]}``;
  ``lz [K, L, H, T]`` (sums of ``log Z_i``), ``zm [K, L, H, T]`` (sums over
  sequences and references of the normaliser's terms, index ``n - 1``),
  ``n [K]`` sequences per block.
  """
  zeros = lambda *s: jnp.zeros(s, jnp.float32)  # noqa: E731
  k, shape = num_blocks, (num_layers, num_heads, seq_len)
  quantity = lambda: {**{name: zeros(k, *shape) for name in SUMS}, "ref": zeros(*shape)}  # noqa: E731
  return dict(s=quantity(), loga=quantity(), lz=zeros(k, *shape), zm=zeros(k, *shape), n=zeros(k))


def block_sums(design: fe.FEDesign, start: int | jax.Array, ref_s: jax.Array, ref_l: jax.Array, s: jax.Array,
               lz: jax.Array, key_start: int | jax.Array = 0) -> tuple[dict, dict]:
  """One head's sums over a block of one sequence's queries ``i = start .. start + R - 1``.

  ``design`` is one mask's (``[T]`` fields), ``ref_s, ref_l [T]`` the
  references, ``s [R, W]`` the block's logits over the keys ``key_start ..
  key_start + W - 1`` (every key the block's queries see, so offsets ``0 ..
  W - 1`` hold every cell; ignored off the cells), ``lz [R]`` its ``log Z``.
  Returns ``(rows, offsets)``: ``rows``
  holds ``s_qs, s_qq, s_qr, loga_qs, loga_qq, loga_qr`` and the
  ``denominators.QUANTITIES`` over the keys (``denominators.query_statistics``
  when the keys are the model's mask), each ``[R]``; ``offsets`` holds this
  block's part of the per-offset sums ``s_os, loga_os`` and of ``zm`` (the
  normaliser's terms of the block's reference queries), each ``[W]``
  (offsets ``0 .. W - 1``; no query of the block has a cell further back),
  summed over the blocks by the caller. A query's sums need only its own
  row, so the blocks add up to the sums of the whole sequence.

  The cumulative ``logsumexp`` of the normaliser reuses the weights:
  ``logsumexp_{d<n} s_{p,p-d} = log Z_p + log sum_{d<n} a_{p,p-d}``. Where
  that sum underflows (the nearest logits 69 nats under ``log Z``; checked
  once per block, so the common case pays nothing) it is taken shifted by
  the query's own logit instead, exact unless a nearer key exceeds that by 80
  nats: exact for rows whose logits span less than ~149 nats.
  """
  size, width = s.shape[-2:]
  valid, keys, refs = fe.row_masks(design, start, size, width)
  raw = fe.skew(s, start - key_start)  # [R, W(d)]
  ref_s, ref_l, rows, offsets = ref_s[:width], ref_l[:width], {}, {}
  r = ref_s[None, :]
  y = jnp.where(valid, raw - r, 0.0)
  offsets["s_os"] = y.sum(-2)
  rows.update(s_qs=y.sum(-1), s_qq=(y * y).sum(-1), s_qr=(y * r).sum(-1))
  # log a = s - log Z_i and ref_l = ref_s - c (offset_profile), so y_loga = y_s - u_i with u = log Z - c on
  # the cells: its sums follow from those of y_s and per-query terms, with no second pass over the grid.
  c = ref_s[0] - ref_l[0]
  u = lz - c
  sv = valid.astype(jnp.float32)
  n_i = jax.lax.dynamic_slice_in_dim(design.query_count, start, size)
  r1 = jnp.einsum("id,d->i", sv, ref_l, precision=fe.HIGHEST)  # sum of ref_l over each query's cells
  offsets["loga_os"] = offsets["s_os"] - jnp.einsum("id,i->d", sv, u, precision=fe.HIGHEST)
  rows.update(loga_qs=rows["s_qs"] - n_i * u, loga_qq=rows["s_qq"] - 2.0 * u * rows["s_qs"] + n_i * u * u,
              loga_qr=rows["s_qr"] - c * rows["s_qs"] - u * r1)
  log_a = jnp.where(keys, raw - lz[:, None], -jnp.inf)
  a = jnp.exp(log_a)
  cs = _cumsum(a)
  tiny = 1e-30  # a normal float32: XLA's CPU flushes subnormals to 0

  def near_keys_too_small() -> jax.Array:  # rare: shift by the query's own logit where the weights underflow
    e = jnp.where(keys, raw - raw[:, :1], -jnp.inf)
    by_diagonal = raw[:, :1] + jnp.log(_cumsum(jnp.exp(jnp.minimum(e, 80.0))))
    return jnp.where(cs >= tiny, lz[:, None] + jnp.log(jnp.maximum(cs, tiny)), by_diagonal)

  cum = jax.lax.cond(jnp.any(keys & (cs < tiny)), near_keys_too_small,
                     lambda: lz[:, None] + jnp.log(jnp.maximum(cs, tiny)))
  offsets["zm"] = jnp.where(refs, cum - raw[:, :1], 0.0).sum(-2)
  key0 = start + jnp.arange(size)[:, None]  # key 0 of query i is offset d = i (past W: not in the block, not seen)
  rows.update(denominators.weight_statistics(a, jnp.where(keys, log_a, 0.0), key0))
  rows.update(log_z=lz, excess=lz - jnp.log(jax.lax.dynamic_slice_in_dim(design.key_count, start, size)))
  return rows, offsets


def _cumsum(x: jax.Array, block: int = 32) -> jax.Array:
  """``cumsum`` along the last axis as two small matmuls: ``[..., T] -> [..., T]``.

  With ``T`` padded to ``m * block`` and ``x`` viewed as ``[..., m, block]``,
  ``cumsum(x)[k, c] = (x[k] @ U_block)[c] + (t @ U'_m)[k]`` where ``t[k]`` is
  block ``k``'s total, ``U`` the upper-triangular ones and ``U'`` its strict
  part: two dense products, where ``jnp.cumsum`` is an associative scan of
  ``log2 T`` strided passes over the ``[T, T]`` weights of one head
  (``docs/benchmarks.md`` compares the two).
  """
  t = x.shape[-1]
  m = -(-t // block)
  xb = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, m * block - t)]).reshape(x.shape[:-1] + (m, block))
  within = jnp.einsum("...kb,bc->...kc", xb, jnp.triu(jnp.ones((block, block), x.dtype)), precision=fe.HIGHEST)
  before = jnp.einsum("...k,kc->...c", within[..., -1], jnp.triu(jnp.ones((m, m), x.dtype), 1),
                      precision=fe.HIGHEST)
  return (within + before[..., None]).reshape(x.shape[:-1] + (m * block,))[..., :t]


def profile_block(design: fe.FEDesign, start: int | jax.Array, s: jax.Array, lz: jax.Array,
                  key_start: int | jax.Array = 0) -> tuple[jax.Array, jax.Array]:
  """One head's part of :func:`offset_profile` from a block of queries (``s [R, W]`` over the keys from
  ``key_start``, ``lz [R]``, as in :func:`block_sums`): per offset the sum of ``s`` over the block's cells
  ``[W]`` (offsets ``0 .. W - 1``), and ``sum_i |C(i)| log Z_i``."""
  size, width = s.shape[-2:]
  valid = fe.row_masks(design, start, size, width)[0]
  n_i = jax.lax.dynamic_slice_in_dim(design.query_count, start, size)
  return jnp.where(valid, fe.skew(s, start - key_start), 0.0).sum(-2), (n_i * lz).sum()


def offset_profile(design: fe.FEDesign, offset_sums: jax.Array, weighted_lz: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """The references of one sequence from its :func:`profile_block` sums over every block (``[..., T]`` and
  ``[...]``): ``ref_s`` the per-offset means of ``s``, ``ref_l = ref_s - c`` with ``c`` the cell mean of
  ``log Z_i`` (an offset profile near that of ``log a``)."""
  ref_s = offset_sums / jnp.maximum(design.offset_count, 1.0)
  return ref_s, ref_s - (weighted_lz / design.n_cells)[..., None]


def update(acc: dict, logits: jax.Array, log_z: jax.Array, seq_ids: jax.Array,
           design: fe.FEDesign) -> tuple[dict, jax.Array, dict]:
  """Adds a batch; returns ``(acc, zres [B, L, H, T], qstats)`` (see :class:`LayerFold`).

  Args:
    acc: from ``init``.
    logits: ``[B, L, H, T, T]``; entries off the cells are ignored (may be -inf).
    log_z: ``[B, L, H, T]``, the model's ``logsumexp`` over each query's visible keys.
    seq_ids: int ``[B]``; sequence ``b`` goes to block ``seq_ids[b] % K``.
    design: ``fixed_effects.make_design(cells)`` with cells ``[T, T]``,
      ``[L, T, T]`` or ``[L, H, T, T]``.

  Each layer is one block of all ``T`` queries folded by :class:`LayerFold`, then :func:`accumulators.count`.
  """
  zres, qstats = [], []
  for layer in range(logits.shape[1]):
    fold = LayerFold(design, layer, seq_ids)
    s, lz = logits[:, layer], log_z[:, layer]
    state = fold(fold.begin(acc, lambda fn, init: fn(init, 0, s[:1], lz[:1])), 0, s, lz)
    acc, z, q = fold.end(acc, state)
    zres.append(z)
    qstats.append(q)
  stacked = {k: jnp.stack([q[k] for q in qstats], 1) for k in qstats[0]}
  return accumulators.count(acc, seq_ids), jnp.stack(zres, 1), stacked


def _head_design(d: fe.FEDesign, head: jax.Array) -> fe.FEDesign:
  """One head's design from one layer's without its layer axis (``[T]`` fields, or ``[H, T]`` per head)."""
  if d.query_count.ndim == 1:
    return d
  return fe.FEDesign(*(jax.lax.dynamic_index_in_dim(x, head, 0, keepdims=False) for x in d))


class LayerFold:
  """Folds one layer's blocks of queries into the leakage accumulators (an ``attention.BlockFold``).

  ``begin(acc, first_blocks)`` takes the layer's references (on the first batch,
  from its first sequence: :func:`offset_profile`, one pass over that
  sequence's blocks, with the keys the blocks of the batch see), ``fold(state, start, logits [B, H, R, W], log_z [B, H, R], key_start)``
  adds a block (:func:`block_sums`, one head of one sequence at a time), and
  ``end(acc, state)`` adds the sequences' sums to their blocks of ``acc``'s
  slice ``layer``, returning ``(acc, zres [B, H, T], qstats)`` (each
  ``[B, H, T]``): ``zres`` is each sequence's ``log Z_i - log Z^mask(n(i))``,
  the normaliser taken from its own reference queries (the attention-feature
  probe reads it). The sequence count ``n`` is not touched: call
  :func:`accumulators.count` once per batch, after the last layer (the first
  batch's references are taken while ``n`` is still 0).
  """

  def __init__(self, design: fe.FEDesign, layer: int, seq_ids: jax.Array):
    d = accumulators.design(design, layer)
    # The layer's design without its layer axis: [T] fields for one mask, [H, T] per head.
    self.design = d if d.query_count.ndim == 1 else fe.FEDesign(*(x[0] for x in d))
    self.layer, self.seq_ids = layer, seq_ids

  def _per_head(self, fn, s: jax.Array, lz: jax.Array, *args):
    """``fn(head design, *head args, s [R, T], lz [R])`` over every (sequence, head) of ``s [B, H, R, T]``, one at
    a time: a head's temporaries stay in cache and in memory the allocator reuses, where a whole layer's would
    need fresh pages the kernel zeroes. ``args`` are per head ``[H, ...]``; outputs come back ``[B, H, ...]``."""
    b, h, r, t = s.shape

    def one(x):
      head, s, lz, *per_head = x
      return fn(_head_design(self.design, head), *per_head, s, lz)

    heads = jnp.tile(jnp.arange(h), b)
    out = jax.lax.map(one, (heads, s.reshape(b * h, r, t), lz.reshape(b * h, r),
                            *(jnp.tile(x, (b,) + (1,) * (x.ndim - 1)) for x in args)))
    return jax.tree.map(lambda x: x.reshape((b, h) + x.shape[1:]), out)

  def begin(self, acc: dict, first_blocks) -> dict:
    part = accumulators.view(acc, self.layer)

    def profile():
      def add(sums, start, s, lz, key_start=0):
        os, wlz = self._per_head(profile_block_at(start, key_start), s.astype(jnp.float32), lz.astype(jnp.float32))
        return sums[0].at[..., :os.shape[-1]].add(os[0]), sums[1] + wlz[0]  # offsets 0 .. W - 1 of the block

      h, t = part["s"]["ref"].shape[1:]
      zero = (jnp.zeros((h, t), jnp.float32), jnp.zeros((h,), jnp.float32))
      return offset_profile(self.design, *first_blocks(add, zero))

    ref_s, ref_l = jax.lax.cond(acc["n"].sum() > 0, lambda: (part["s"]["ref"][0], part["loga"]["ref"][0]), profile)
    zeros = jnp.zeros((len(self.seq_ids),) + ref_s.shape, jnp.float32)
    return {"ref_s": ref_s, "ref_l": ref_l, "rows": {k: zeros for k in ROWS},
            "offsets": {k: zeros for k in OFFSETS}}

  def __call__(self, state: dict, start, logits: jax.Array, log_z: jax.Array, key_start=0) -> dict:
    rows, offsets = self._per_head(block_sums_at(start, key_start), logits.astype(jnp.float32),
                                   log_z.astype(jnp.float32), state["ref_s"], state["ref_l"])
    put = lambda whole, x: jax.lax.dynamic_update_slice_in_dim(whole, x, start, axis=2)  # noqa: E731
    add = lambda whole, x: whole.at[..., :x.shape[-1]].add(x)  # noqa: E731  offsets 0 .. W - 1 of the band
    return {**state, "rows": {k: put(state["rows"][k], v) for k, v in rows.items()},
            "offsets": {k: add(state["offsets"][k], v) for k, v in offsets.items()}}

  def end(self, acc: dict, state: dict) -> tuple[dict, jax.Array, dict]:
    part = accumulators.view(acc, self.layer)
    sums = {**state["rows"], **state["offsets"]}
    num_blocks = acc["n"].shape[0]
    onehot = jax.nn.one_hot(self.seq_ids % num_blocks, num_blocks, dtype=jnp.float32)
    add = lambda a, x: a + jnp.einsum("bk,b...->k...", onehot, x[:, None], precision=fe.HIGHEST)  # noqa: E731
    out = {name: {**{k: add(part[name][k], sums[f"{name}_{k}"]) for k in SUMS}, "ref": ref[None]}
           for name, ref in (("s", state["ref_s"]), ("loga", state["ref_l"]))}
    lz = sums["log_z"]
    out.update(lz=add(part["lz"], lz), zm=add(part["zm"], sums["zm"]), n=part["n"])
    zmask = sums["zm"] / jnp.maximum(self.design.ref_count, 1.0)  # [B, H, T], index n - 1
    at_count = jnp.broadcast_to((self.design.key_count - 1).astype(jnp.int32), zmask.shape)
    qstats = {k: sums[k] for k in denominators.QUANTITIES}
    return accumulators.write(acc, self.layer, out), lz - jnp.take_along_axis(zmask, at_count, -1), qstats


def block_sums_at(start, key_start=0):
  """:func:`block_sums` at ``start`` (keys from ``key_start``) as ``fn(design, ref_s, ref_l, s, lz)``."""
  return lambda design, ref_s, ref_l, s, lz: block_sums(design, start, ref_s, ref_l, s, lz, key_start)


def profile_block_at(start, key_start=0):
  """:func:`profile_block` at ``start`` (keys from ``key_start``) as ``fn(design, s, lz)``."""
  return lambda design, s, lz: profile_block(design, start, s, lz, key_start)


def _half_weights(keep: jax.Array) -> jax.Array:
  """``[2, K]``: the kept blocks of half 0 (even blocks) and half 1 (odd blocks)."""
  parity = jnp.arange(keep.shape[0]) % 2
  return jnp.stack([keep * (parity == 0), keep * (parity == 1)])


def _sum_x(design: fe.FEDesign, sums: dict, ref: jax.Array, n: jax.Array, queries: jax.Array):
  """``(count, sum x, sum x^2)`` over the observations of ``queries [T]`` (one head) from ref-centred sums."""
  r1, r2 = fe.query_sums(design, ref), fe.query_sums(design, ref * ref)  # per query: over its cells
  q = queries.astype(jnp.float32)
  count = n * (design.query_count * q).sum()
  total = (q * (sums["qs"] + n * r1)).sum()
  squares = (q * (sums["qq"] + 2.0 * sums["qr"] + n * r2)).sum()
  return count, total, squares


def _head(acc: dict, design: fe.FEDesign, keep: jax.Array, early_max: int) -> dict[str, jax.Array]:
  """Everything of one head: ``acc`` leaves ``[K, T]`` (refs ``[T]``), one mask."""
  halves = _half_weights(keep)  # [2, K]
  w = jnp.concatenate([halves, keep[None]])  # half 0, half 1, all
  n = w @ acc["n"]  # [3]
  tot = lambda x: w @ x  # noqa: E731  [K, T] -> [3, T]
  out = {}
  coefs = {}
  for name in ("s", "loga"):
    sums = {k: tot(acc[name][k]) for k in SUMS}
    means = lambda k: sums[k] / jnp.maximum(n, 1.0)[:, None]  # noqa: E731
    coef_a = fe.fit_two_way(design, means("os"), means("qs"))  # [3, 2T]
    coef_b = fe.fit_offset_only(design, means("os"))
    coefs[name] = coef_a
    everything = jnp.ones_like(design.query_count, bool)
    r2 = {"two_way": [], "offset": []}
    for fit, test in ((0, 1), (1, 0)):
      count, total, squares = _sum_x(design, {k: v[test] for k, v in sums.items()}, acc[name]["ref"], n[test],
                                     everything)
      sst = squares - total * total / jnp.maximum(count, 1.0)
      ok = (n[fit] > 0) & (n[test] > 0) & (sst > 0)
      for model, coef in (("two_way", coef_a), ("offset", coef_b)):
        err = fe.sse(design, coef[fit], sums["os"][test], sums["qs"][test], sums["qq"][test].sum(), n[test])
        r2[model].append(jnp.where(ok, 1.0 - err / jnp.where(ok, sst, 1.0), jnp.nan))
    for model in r2:
      out[f"r2_{model}_{name}"] = (r2[model][0] + r2[model][1]) / 2
    out[f"leakage_{name}"] = out[f"r2_two_way_{name}"] - out[f"r2_offset_{name}"]

  # Effects per half (0, 1) and from all kept sequences (2).
  phi_s = fe.query_effect(design, coefs["s"])
  lz = tot(acc["lz"]) / jnp.maximum(n, 1.0)[:, None]
  zm = tot(acc["zm"]) / jnp.maximum(n[:, None] * design.ref_count, 1.0)
  zmask = jnp.take(zm, (design.key_count - 1).astype(jnp.int32), axis=-1)
  phi_zmask = fe.query_function_effect(design, zmask)
  phi_zres = fe.query_function_effect(design, lz - zmask)
  phi_loga = phi_s - phi_zmask - phi_zres
  mask_part, res_part = -phi_zmask, phi_s - phi_zres
  out.update(phi_s=phi_s[2], phi_zmask=phi_zmask[2], phi_zres=phi_zres[2], phi_loga=phi_loga[2], zmask=zm[2],
             phi_identity_err=jnp.abs(fe.query_effect(design, coefs["loga"][2]) - phi_loga[2]).max())
  q = jnp.arange(design.query_count.shape[-1])
  loga_sums = {k: tot(acc["loga"][k])[2] for k in SUMS}
  for prefix, queries in (("", jnp.ones_like(q, bool)), ("early_", (q >= 1) & (q < early_max))):
    wq = design.query_count * queries
    total_w = jnp.maximum(wq.sum(), 1.0)
    centre = lambda f: f - (wq * f).sum(-1, keepdims=True) / total_w  # noqa: E731

    def cov(a: jax.Array, b: jax.Array) -> jax.Array:
      a, b = centre(a), centre(b)
      cross = ((wq * a[0] * b[1]).sum() + (wq * a[1] * b[0]).sum()) / (2.0 * total_w)
      return jnp.where((wq.sum() > 0) & (n[0] > 0) & (n[1] > 0), cross, jnp.nan)

    count, total, squares = _sum_x(design, loga_sums, acc["loga"]["ref"], n[2], queries)
    var_total = _div(squares - total * total / jnp.maximum(count, 1.0), count)
    out.update({prefix + "var_phi": cov(phi_loga, phi_loga), prefix + "cov_mask": cov(phi_loga, mask_part),
                prefix + "cov_res": cov(phi_loga, res_part), prefix + "var_mask": cov(mask_part, mask_part),
                prefix + "var_res": cov(res_part, res_part), prefix + "var_total": var_total})
  return out


def design_axes(design: fe.FEDesign) -> tuple[fe.FEDesign, fe.FEDesign]:
  """``vmap`` in_axes of a design over layers and over heads (``0`` where it has that axis, else None)."""
  lead = design.query_count.ndim - 1
  per = lambda has: fe.FEDesign(*[0 if has else None for _ in fe.FEDesign._fields])  # noqa: E731
  return per(lead >= 1), per(lead >= 2)


def finalize(acc: dict, design: fe.FEDesign, keep: jax.Array | None = None,
             early_max: int = 16) -> dict[str, jax.Array]:
  """Leakage and component statistics of the kept blocks (jittable; ``keep [K]``, default all).

  Returns (``X`` in {s, loga}; ``P`` in {"", "early_"}; ``Q`` any of
  ``var_phi, var_total, cov_mask, cov_res, var_mask, var_res, leakage_share, comp_mask, comp_res,
  share_mask, share_res``):
    ``r2_two_way_X, r2_offset_X, leakage_X [L, H]``, ``leakage_X_layer [L]``,
    ``leakage_X_overall []``; ``phi_s, phi_zmask, phi_zres, phi_loga [L, H, T]``
    (from all kept sequences), ``zmask [L, H, T]`` (``log Z^mask(n)`` at index
    ``n - 1``), ``phi_identity_err [L, H]``; ``PQ [L, H]``, ``PQ_layer [L]``,
    ``PQ_overall []``.
  """
  if keep is None:
    keep = jnp.ones_like(acc["n"])
  # acc leaves [K, L, H, T] (refs [L, H, T]): map layers, then heads, down to [K, T] (refs [T]).
  quantity = {**{k: 1 for k in SUMS}, "ref": 0}
  acc_axes = dict(s=quantity, loga=quantity, lz=1, zm=1, n=None)
  layer_axes, head_axes = design_axes(design)
  per_head = jax.vmap(functools.partial(_head, early_max=early_max), in_axes=(acc_axes, head_axes, None))
  out = jax.vmap(per_head, in_axes=(acc_axes, layer_axes, None))(acc, design, keep)
  for name in ("s", "loga"):
    out[f"leakage_{name}_layer"] = out[f"leakage_{name}"].mean(-1)
    out[f"leakage_{name}_overall"] = out[f"leakage_{name}"].mean()
  for prefix in ("", "early_"):
    for scope, pool in (("_layer", lambda x: x.mean(-1)), ("_overall", jnp.mean)):
      for k in _BASE:
        out[prefix + k + scope] = pool(out[prefix + k])
    for scope in ("", "_layer", "_overall"):
      for k, (num, den) in _RATIOS.items():
        out[prefix + k + scope] = _div(out[prefix + num + scope], out[prefix + den + scope])
  return out


def _components(ci: dict) -> dict:
  """summary.json's ``components``: the shares per layer, pooled and per head, with their intervals."""
  out = {}
  for prefix, suffix in (("", ""), ("early_", "_early")):
    pooled, per_head = {}, {}
    for comp, share, var in (("causal_mask", "share_mask", "var_mask"), ("residual_stream", "share_res", "var_res")):
      out.update(schema.with_ci(ci, f"leakage.{prefix}{share}_layer", comp + suffix))
      pooled.update(schema.with_ci(ci, f"leakage.{prefix}{share}_overall", comp))
      pooled.update(schema.with_ci(ci, f"leakage.{prefix}{var}_overall", comp + "_var"))
      per_head.update(schema.with_ci(ci, f"leakage.{prefix}{share}", comp))
    pooled.update(schema.with_ci(ci, f"leakage.{prefix}leakage_share_overall", "leakage_share"))
    out["pooled" + suffix] = pooled
    out["per_head" + suffix] = per_head
    out["leakage_share" + suffix] = schema.tolist(ci["value"][f"leakage.{prefix}leakage_share_layer"])
  return out


# The results that carry a jackknife interval.
INTERVAL_KEYS = tuple(f"{p}{k}{scope}" for p in ("", "early_")
                      for k in ("share_mask", "share_res", "leakage_share", "var_phi", "var_mask", "var_res",
                                "cov_mask", "cov_res")
                      for scope in ("", "_layer", "_overall")) + tuple(
                          f"leakage_{x}{scope}" for x in ("s", "loga") for scope in ("", "_layer", "_overall"))


def summarize(fin: dict[str, jax.Array], ci: dict) -> dict:
  """summary.json's ``leakage`` and ``components`` from the jackknife summary ``ci`` (keys ``leakage.<name>``;
  every entry has an interval, so ``fin`` is unused)."""
  out = {}
  for key, name in (("logits", "s"), ("log_weights", "loga")):
    for scope in ("_layer", "_overall"):
      out.update(schema.with_ci(ci, f"leakage.leakage_{name}{scope}", key + scope))
  return {"leakage": out, "components": _components(ci)}


def arrays(fin: dict[str, jax.Array], ci: dict) -> dict[str, np.ndarray]:
  """stats.npz's leakage arrays: the query effects ``phi_* [layer, head, query]`` and ``zmask``, and the shares
  and leakages ``[layer, head]`` with their interval bounds (``_lo``, ``_hi``)."""
  out = {name: np.asarray(fin[name]) for name in ("phi_s", "phi_zmask", "phi_zres", "phi_loga", "zmask")}
  for name in ("share_mask", "share_res", "early_share_mask", "early_share_res", "leakage_s", "leakage_loga"):
    key = f"leakage.{name}"
    out[name], out[name + "_lo"], out[name + "_hi"] = (np.asarray(ci[k][key]) for k in ("value", "lo", "hi"))
  return out
