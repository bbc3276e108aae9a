"""Estimators against brute-force NumPy and the exact cases of DESIGN section 3 (v2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings, strategies as st

from abspos_jax.analysis.estimators import denominators, fixed_effects as fe, intervals, leakage, position0, probes
from abspos_jax.analysis.estimators import sinks

K = 4  # sequence blocks in these tests (halves: even / odd blocks)


def mask(t: int, window: int | None = None) -> np.ndarray:
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  vis = j <= i
  return vis if window is None else vis & (j > i - window)


def softmax_inputs(s: np.ndarray, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Logits ``[B, L, H, T, T]`` with -inf off the mask, and their ``log_z``."""
  vis = visible if visible.ndim == 2 else visible[:, None]
  s = np.where(vis, s, -np.inf).astype(np.float32)
  return s, scipy.special.logsumexp(s, axis=-1).astype(np.float32)


def dummy_design(vis: np.ndarray, n: int, two_way: bool) -> np.ndarray:
  """Per-observation dummy design: n copies of every visible cell (row-major)."""
  t = vis.shape[0]
  rows = []
  for i, j in zip(*np.nonzero(vis)):
    r = np.zeros(2 * t if two_way else t)
    r[i - j] = 1.0
    if two_way:
      r[t + i] = 1.0
    rows.append(r)
  return np.tile(np.array(rows), (n, 1))


def lstsq_fit(vis, x_obs, two_way):
  """OLS on pooled observations ``x_obs [N, T, T]``: fitted cell values and coefficients."""
  d = dummy_design(vis, x_obs.shape[0], two_way)
  y = np.concatenate([x[vis] for x in x_obs]).astype(np.float64)
  coef = np.linalg.lstsq(d, y, rcond=None)[0]
  n_cells = int(vis.sum())
  fitted = np.zeros(vis.shape)
  fitted[vis] = (d[:n_cells] @ coef)
  return fitted, coef


def np_phi(vis, beta):
  qc = vis.sum(1)
  return beta - (qc * beta).sum() / qc.sum()


def sums(vis, x):
  """Per-offset and per-query sums of ``x [N, T, T]`` over the cells, and the sum of squares."""
  t = vis.shape[0]
  i, j = np.nonzero(vis)
  os_ = np.zeros(t)
  np.add.at(os_, i - j, x[:, i, j].sum(0))
  return os_, np.where(vis, x, 0).sum((0, 2)), (np.where(vis, x, 0) ** 2).sum()


MASKS = [(7, None), (8, 3), (6, 6), (9, 1), (9, 4)]


@pytest.mark.parametrize("t,window", MASKS)
def test_fixed_effects_match_lstsq(t, window):
  rng = np.random.default_rng(t * 10 + (window or 0))
  vis = mask(t, window)
  x = rng.normal(size=(5, t, t)) + rng.normal(size=(t, 1)) + 3.0 * rng.normal(size=(1, 1, t))
  design = fe.make_design(vis)
  os_, qs, ss = sums(vis, x)
  n = x.shape[0]
  coef_a = fe.fit_two_way(design, jnp.asarray(os_ / n, jnp.float32), jnp.asarray(qs / n, jnp.float32))
  coef_b = fe.fit_offset_only(design, jnp.asarray(os_ / n, jnp.float32))
  for coef, two_way in ((coef_a, True), (coef_b, False)):
    fitted, ref = lstsq_fit(vis, x, two_way)
    want_sse = sum(((v - fitted)[vis] ** 2).sum() for v in x)
    got = fe.sse(design, coef, jnp.asarray(os_), jnp.asarray(qs), jnp.asarray(ss), n)
    np.testing.assert_allclose(got, want_sse, rtol=1e-4, atol=1e-3)
    if two_way:
      np.testing.assert_allclose(fe.query_effect(design, coef), np_phi(vis, ref[t:]), atol=2e-5)


@settings(max_examples=15, deadline=None)
@given(t=st.integers(2, 10), window=st.one_of(st.none(), st.integers(1, 10)), seed=st.integers(0, 2**16))
def test_query_function_and_linearity(t, window, seed):
  rng = np.random.default_rng(seed)
  vis = mask(t, window)
  design = fe.make_design(vis)

  def phi(x):
    os_, qs, _ = sums(vis, x[None])
    return fe.query_effect(design, fe.fit_two_way(design, jnp.asarray(os_, jnp.float32),
                                                  jnp.asarray(qs, jnp.float32)))

  f = rng.normal(size=t)
  np.testing.assert_allclose(phi(np.broadcast_to(f[:, None], (t, t))), np_phi(vis, f), atol=1e-5)
  np.testing.assert_allclose(fe.query_function_effect(design, jnp.asarray(f, jnp.float32)), np_phi(vis, f), atol=1e-6)
  x, y = rng.normal(size=(2, t, t))
  np.testing.assert_allclose(phi(x + y), phi(x) + phi(y), atol=1e-5)
  g = rng.normal(size=t)  # a pure offset function has no query effect
  np.testing.assert_allclose(phi(g[np.clip(np.subtract.outer(np.arange(t), np.arange(t)), 0, t - 1)]), 0.0,
                             atol=1e-5)


def test_make_design_rejects_bad_masks():
  with pytest.raises(ValueError, match="causal"):
    fe.make_design(np.ones((4, 4), bool))
  bad = mask(4)
  bad[2, 2] = False
  with pytest.raises(ValueError, match="see itself"):
    fe.make_design(bad)
  gap = mask(5)
  gap[4, 2] = False
  with pytest.raises(ValueError, match="contiguous"):
    fe.make_design(gap)
  stacked = fe.make_design(np.stack([mask(5), mask(5, 2), mask(5)]))
  assert stacked.normal_pinv.shape == (3, 10, 10)
  # References of the mask-only normaliser: n keys none of which is key 0; p = T-1 for n = T.
  d = fe.make_design(mask(5))
  np.testing.assert_array_equal(d.ref_count, [4, 3, 2, 1, 1])
  assert bool(d.ref_valid[4, 4]) and not bool(d.ref_valid[3, 3])
  np.testing.assert_array_equal(fe.make_design(mask(6, 3)).ref_count, [5, 4, 3, 0, 0, 0])


def np_zmask(s, vis):
  """``log Z^mask(n)`` by its definition, ``s [N, T, T]`` (-inf off ``vis``): ``[T]`` (0 where no reference)."""
  t = vis.shape[0]
  out = np.zeros(t)
  for n in range(1, t + 1):
    refs = [p for p in range(t) if p - n + 1 >= 1 and vis[p, p - n + 1]] or ([t - 1] if vis[t - 1, t - n] else [])
    if refs:
      out[n - 1] = np.mean([scipy.special.logsumexp(x[p, p - n + 1:p + 1]) - x[p, p] for x in s for p in refs])
  return out


def test_mask_only_normaliser_is_exact_over_wide_ranges():
  """A sink 60 nats above the rest, a steep rising profile (far keys 90 nats above near ones), a falling one."""
  rng = np.random.default_rng(2)
  t = 32
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  for profile in (60.0 * (j == 0), 3.0 * (j - i), -3.0 * (j - i)):
    s, log_z = softmax_inputs(profile + rng.normal(size=(4, 1, 1, t, t)), mask(t))
    *_, fin = run_leakage(s, log_z, mask(t))
    np.testing.assert_allclose(fin["zmask"][0, 0], np_zmask(s[:, 0, 0].astype(np.float64), mask(t)),
                               rtol=1e-5, atol=2e-4)


# --- leakage: brute force ------------------------------------------------------

def np_leakage(s, log_z, vis, seq_ids, num_blocks, early_max):
  """The v2 definitions from scratch, one head: ``s [N, T, T]`` (-inf off ``vis``), ``log_z [N, T]``."""
  t = vis.shape[0]
  half = (seq_ids % num_blocks) % 2
  loga = np.where(vis, s - log_z[:, :, None], 0.0)
  sv = np.where(vis, s, 0.0)
  qc = vis.sum(1)
  n_of = qc  # keys = cells here
  out = {}
  for name, x in (("s", sv), ("loga", loga)):
    r2 = {}
    for two_way in (True, False):
      vals = []
      for fit, test in ((0, 1), (1, 0)):
        fitted, _ = lstsq_fit(vis, x[half == fit], two_way)
        xt = np.concatenate([v[vis] for v in x[half == test]])
        sse = sum(((v - fitted)[vis] ** 2).sum() for v in x[half == test])
        vals.append(1 - sse / ((xt - xt.mean()) ** 2).sum())
      r2[two_way] = np.mean(vals)
    out[f"leakage_{name}"] = r2[True] - r2[False]

  def effects(sel):
    _, coef = lstsq_fit(vis, sv[sel], True)
    phi_s = np_phi(vis, coef[t:])
    zm = np.zeros(t)
    for n in range(1, t + 1):
      refs = [p for p in range(t) if p - n + 1 >= 1 and vis[p, p - n + 1]] or [t - 1]
      zm[n - 1] = np.mean([scipy.special.logsumexp(s[b, p, p - n + 1:p + 1]) - s[b, p, p]
                           for b in np.nonzero(sel)[0] for p in refs])
    zmask = zm[n_of - 1]
    lz = log_z[sel].mean(0)
    phi_zmask, phi_zres = np_phi(vis, zmask), np_phi(vis, lz - zmask)
    return phi_s - phi_zmask - phi_zres, -phi_zmask, phi_s - phi_zres

  e0, e1 = effects(half == 0), effects(half == 1)
  q = np.arange(t)
  for prefix, use in (("", q >= 0), ("early_", (q >= 1) & (q < early_max))):
    w = qc * use

    def cov(a, b):
      c = lambda f: f - (w * f).sum() / w.sum()  # noqa: E731
      return ((w * c(a[0]) * c(b[1])).sum() + (w * c(a[1]) * c(b[0])).sum()) / (2 * w.sum())

    phi, m, r = ([e0[k], e1[k]] for k in range(3))
    out[prefix + "var_phi"], out[prefix + "cov_mask"], out[prefix + "cov_res"] = cov(phi, phi), cov(phi, m), cov(phi, r)
    out[prefix + "var_res"] = cov(r, r)
    cells = vis & use[:, None]
    xs = loga[:, cells]
    out[prefix + "var_total"] = xs.var()
  return out


def run_leakage(s, log_z, visible, seq_ids=None, parts=1, early_max=4, num_blocks=K, cells=None):
  n = s.shape[0]
  seq_ids = np.arange(n) if seq_ids is None else seq_ids
  design = fe.make_design(visible if cells is None else cells)
  acc = leakage.init(s.shape[1], s.shape[2], s.shape[-1], num_blocks)
  update = jax.jit(leakage.update)
  for p in np.array_split(np.arange(n), parts):
    acc, *_ = update(acc, jnp.asarray(s[p]), jnp.asarray(log_z[p]), jnp.asarray(seq_ids[p]), design)
  fin = jax.jit(leakage.finalize, static_argnames="early_max")(acc, design, early_max=early_max)
  return acc, design, fin


VIS_LG = np.stack([mask(8, 3), mask(8)])  # one local, one global layer


def test_leakage_matches_numpy_and_accumulates():
  rng = np.random.default_rng(3)
  n, t = 10, 8
  base = 3.0 * rng.normal(size=(1, 2, 2, t, t))  # shared structure, so the effects are not pure noise
  s, log_z = softmax_inputs(base + rng.normal(size=(n, 2, 2, t, t)) + 20.0, VIS_LG)
  ids = rng.permutation(40)[:n]
  _, _, one = run_leakage(s, log_z, VIS_LG, ids)
  _, _, three = run_leakage(s, log_z, VIS_LG, ids, parts=3)
  for l in range(2):
    for h in range(2):
      want = np_leakage(s[:, l, h].astype(np.float64), log_z[:, l, h].astype(np.float64), VIS_LG[l], ids, K, 4)
      for got in (one, three):
        for key, value in want.items():
          np.testing.assert_allclose(got[key][l, h], value, rtol=2e-3, atol=2e-4, err_msg=f"{key} l{l} h{h}")
  for got in (one, three):
    for prefix in ("", "early_"):
      total = np.asarray(got[prefix + "cov_mask"]) + np.asarray(got[prefix + "cov_res"])
      np.testing.assert_allclose(total, got[prefix + "var_phi"], rtol=1e-5, atol=1e-7)
      for scope in ("", "_layer", "_overall"):
        np.testing.assert_allclose(np.asarray(got[prefix + "share_mask" + scope]) + got[prefix + "share_res" + scope],
                                   1.0, atol=1e-5)
    np.testing.assert_allclose(got["cov_res_layer"], np.asarray(got["cov_res"]).mean(-1), rtol=1e-6)
    assert float(np.max(got["phi_identity_err"])) < 1e-4


# --- leakage: the exact cases ----------------------------------------------------

T_EXACT = 24


def constructed(profile: np.ndarray, n: int = 16, noise: float = 0.0, seed: int = 0, visible=None):
  """Logits ``profile [T, T] + noise`` for ``n`` sequences, one layer, two heads, and their analysis."""
  visible = mask(profile.shape[-1]) if visible is None else visible
  rng = np.random.default_rng(seed)
  s = profile[None, None, None] + noise * rng.normal(size=(n, 1, 2) + profile.shape)
  s, log_z = softmax_inputs(s, visible)
  return run_leakage(s, log_z, visible, early_max=8)


def ij(t=T_EXACT):
  return np.arange(t)[:, None].astype(np.float64), np.arange(t)[None, :].astype(np.float64)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.floats(0.1, 4.0), window=st.one_of(st.none(), st.integers(2, 24)))
def test_offset_only_logits_are_all_mask(seed, scale, window):
  """``s_ij = f(i - j)`` for a random profile f: no absolute position anywhere."""
  i, j = ij()
  f = scale * np.random.default_rng(seed).normal(size=T_EXACT)
  *_, fin = constructed(f[np.clip(i - j, 0, T_EXACT - 1).astype(int)], visible=mask(T_EXACT, window))
  for prefix in ("", "early_"):
    var = np.asarray(fin[prefix + "var_phi"])
    assert (np.abs(fin[prefix + "cov_res"]) <= 1e-4 * var + 1e-7).all()
    assert (np.abs(fin[prefix + "var_res"]) <= 1e-4 * var + 1e-7).all()
    if float(fin[prefix + "var_phi_overall"]) > 1e-6:  # a window of 2 keys leaves early queries no mask effect
      np.testing.assert_allclose(fin[prefix + "share_mask_overall"], 1.0, atol=1e-3)
  np.testing.assert_allclose(fin["phi_zres"], 0.0, atol=1e-4)


@pytest.mark.parametrize("c", [0.1, 0.5, 2.0])
def test_linear_offset_profiles_are_all_mask(c):
  """``s_ij = -c (i - j)``: v1 gave residual shares of -0.93, -4.5 and -23.6."""
  i, j = ij()
  *_, fin = constructed(-c * (i - j))
  np.testing.assert_allclose(fin["share_res_overall"], 0.0, atol=1e-4)
  np.testing.assert_allclose(fin["early_share_mask_overall"], 1.0, atol=1e-4)


def test_flat_logits_are_all_mask_with_log_visible_normaliser():
  *_, fin = constructed(np.zeros((T_EXACT, T_EXACT)))
  np.testing.assert_allclose(fin["zmask"][0, 0], np.log(np.arange(1, T_EXACT + 1)), atol=1e-5)
  np.testing.assert_allclose(fin["share_mask_overall"], 1.0, atol=1e-6)
  np.testing.assert_allclose(fin["var_res"], 0.0, atol=1e-9)


def test_key_position_term_is_relative_in_disguise():
  """``s_ij = c j = c i - c (i - j)``: the query term cancels in the softmax, the rest is an offset profile."""
  i, j = ij()
  for c in (0.2, 1.0):
    *_, fin = constructed(c * j + 0.0 * i)
    np.testing.assert_allclose(fin["share_res_overall"], 0.0, atol=1e-4)
    assert float(np.max(np.abs(fin["var_res"]))) < 1e-4 * float(np.max(fin["var_phi"]))


def test_absolute_term_is_residual_stream():
  """``s_ij = c i j / T``: position enters beyond the offset; the residual-stream share dominates."""
  i, j = ij()
  acc, design, fin = constructed(2.0 * i * j / T_EXACT, noise=0.3)
  ci = block_intervals(acc, design)
  assert float(fin["share_res_overall"]) > 0.5
  assert ci["lo"]["share_res_overall"] > 0.5 and ci["lo"]["var_res_overall"] > 0


def test_key0_bonus_is_residual_stream():
  """A logit bonus ``b`` on key 0 (a planted sink): the residual part is clearly non-zero.

  Its share is a signed projection on the total effect: a sink flattens the
  mask's fall of ``log a`` at later queries, so the sign depends on ``b``;
  ``var_res`` (the part's own size) is what must exceed 0.
  """
  i, j = ij()
  for b in (-2.0, 3.0):
    acc, design, fin = constructed(b * (j == 0) + 0.0 * i, noise=0.3)
    ci = block_intervals(acc, design)
    assert ci["lo"]["var_res_overall"] > 0


def block_intervals(acc, design, early_max=8):
  keys = ("share_res_overall", "var_res_overall", "share_mask_overall", "early_share_res_overall")
  stacked = intervals.evaluate(
      lambda keep, a, d: {k: leakage.finalize(a, d, keep, early_max=early_max)[k] for k in keys}, acc["n"].shape[0],
      acc, design)
  return intervals.summarize(stacked, np.asarray(acc["n"]))


def test_content_noise_without_position_covers_zero():
  """I.i.d. logits: no position but the mask; the residual share's interval covers 0 (8 seeds, all of them)."""
  for seed in range(8):
    s, log_z = softmax_inputs(np.random.default_rng(seed).normal(size=(32, 1, 1, 16, 16)), mask(16))
    acc, design, _ = run_leakage(s, log_z, mask(16), num_blocks=16, early_max=8)
    ci = block_intervals(acc, design)
    assert ci["lo"]["share_res_overall"] <= 0.0 <= ci["hi"]["share_res_overall"], seed


def test_shares_agree_across_numbers_of_sequences():
  """Offset profile plus noise: v1's pooled residual share drifted -0.31 / -1.17 / -1.65 / -1.95 at 8 / 16 / 64 / 256."""
  i, j = ij(16)
  profile = -0.4 * (i - j) + 1.5 * (j == 0)
  got = {}
  for n in (8, 64, 256):
    acc, design, _ = constructed(profile, n=n, noise=1.0, seed=n)
    ci = block_intervals(acc, design)
    got[n] = (ci["value"]["share_res_overall"], ci["lo"]["share_res_overall"], ci["hi"]["share_res_overall"])
  for a in got:
    for b in got:
      assert got[a][1] <= got[b][0] <= got[a][2] or got[b][1] <= got[a][0] <= got[b][2], got
  # The 256-sequence estimate sits inside the 8-sequence interval: no drift with n.
  assert got[8][1] <= got[256][0] <= got[8][2]


def test_sliding_window_mask_term_constant_past_window():
  w = 4
  i, j = ij(12)
  *_, fin = constructed(-0.3 * (i - j), visible=mask(12, w))
  phi = np.asarray(fin["phi_zmask"])[0, 0]
  np.testing.assert_allclose(phi[w - 1:], phi[w - 1], atol=1e-5)
  assert np.all(np.diff(phi[:w]) > 0.05)


def test_sink_ablate_cells_keep_one_normaliser_per_head():
  """Flat logits with key 0 removed from the cells: whether the softmax still sees key 0 (reference pass)
  or not (ablated pass), the split books everything to the mask when the normaliser counts the right keys."""
  t = 12
  cells = mask(t) & ~((np.arange(t)[:, None] >= 1) & (np.arange(t)[None, :] == 0))
  flat = np.zeros((8, 1, 1, t, t))
  for keys, softmax_mask in ((mask(t), mask(t)), (cells, cells)):
    s, log_z = softmax_inputs(flat, softmax_mask)
    design = fe.make_design(cells, keys=keys)
    acc, *_ = leakage.update(leakage.init(1, 1, t, K), jnp.asarray(np.zeros((8, 1, 1, t, t), np.float32)),
                            jnp.asarray(log_z), jnp.arange(8), design)
    fin = leakage.finalize(acc, design)
    np.testing.assert_allclose(fin["var_res"], 0.0, atol=1e-9)
    np.testing.assert_allclose(fin["share_mask_overall"], 1.0, atol=1e-5)


# --- intervals ----------------------------------------------------------------

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


# --- denominators -------------------------------------------------------------

L, H, T = 2, 2, 8


def test_denominators_match_numpy_and_accumulate():
  rng = np.random.default_rng(6)
  n = 9
  s, log_z = softmax_inputs(20.0 + 2.0 * rng.normal(size=(n, L, H, T, T)), VIS_LG)
  ids = np.arange(n)
  acc1 = denominators.update(denominators.init(L, H, T, K), s, log_z, VIS_LG, ids)
  acc3 = denominators.init(L, H, T, K)
  for p in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(denominators.update)(acc3, s[p], log_z[p], VIS_LG, ids[p])
  one, three = denominators.finalize(acc1, VIS_LG), denominators.finalize(acc3, VIS_LG)
  vis = VIS_LG[:, None]
  a = np.where(vis, np.exp(s.astype(np.float64) - log_z[..., None]), 0.0)
  log_v = np.log(VIS_LG.sum(-1))
  with np.errstate(divide="ignore", invalid="ignore"):
    ent = -np.where(a > 0, a * np.log(a), 0.0).sum(-1)
  per_seq = dict(log_z=log_z, excess=log_z - log_v[:, None], entropy=ent,
                 max_weight=a.max(-1), sink_mass=a[..., 0])
  for q, v in per_seq.items():
    for got in (one, three):
      np.testing.assert_allclose(got[q], v.mean(0), atol=2e-5, err_msg=q)
      np.testing.assert_allclose(got[q + "_std"], v.std(0), atol=2e-5, err_msg=q)
  half = (ids % K) % 2
  for h in (0, 1):
    np.testing.assert_allclose(one["sink_mass_half"][h], a[half == h, ..., 0].mean(0), atol=2e-6)
  np.testing.assert_allclose(one["log_visible"], log_v, atol=1e-7)
  for l, k in ((0, 3), (1, T)):  # the local layer (W = 3) uses queries 0..2 only
    for h in range(H):
      slope = np.polyfit(log_v[l, :k], log_z.mean(0)[l, h, :k], 1)[0]
      np.testing.assert_allclose(one["log_z_slope"][l, h], slope, rtol=1e-4, atol=1e-5)
  assert np.isnan(denominators.finalize(acc1, np.stack([mask(T, 1)] * L))["log_z_slope"]).all()


def test_entropy_ignores_a_removed_key():
  """A key removed by an edit (logit -inf inside the mask, as sink_ablate does) adds nothing, not NaN."""
  s = np.zeros((1, 1, 1, 4, 4), np.float32)
  s[..., 1:, 0] = -np.inf
  s, log_z = softmax_inputs(s, mask(4))
  st_ = denominators.query_statistics(jnp.asarray(s), jnp.asarray(log_z), mask(4))
  np.testing.assert_allclose(st_["entropy"][0, 0, 0], [0.0, 0.0, np.log(2), np.log(3)], atol=1e-6)


# --- sinks ----------------------------------------------------------------------

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


# --- probes ---------------------------------------------------------------------

def test_ridge_probe_matches_normal_equations():
  rng = np.random.default_rng(7)
  n, nl, t, p = 10, 2, 12, 5
  pos = np.log1p(np.arange(t))
  f = rng.normal(size=(n, nl, t, p)) * np.array([1.0, 10.0, 0.1, 1.0, 1.0])
  f[..., 0] += 5.0 * pos  # a readable position signal
  f += 50.0
  ids = np.arange(n) * 3
  acc1 = probes.update(probes.init(nl, p, K), jnp.asarray(f, jnp.float32), jnp.asarray(ids))
  acc3 = probes.init(nl, p, K)
  for part in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(probes.update)(acc3, jnp.asarray(f[part], jnp.float32), jnp.asarray(ids[part]))
  one, three = probes.finalize(acc1), probes.finalize(acc3)
  half = (ids % K) % 2
  for l in range(nl):
    rows = lambda k: f[half == k, l, 1:].reshape(-1, p)  # noqa: E731
    r2s, lams = [], []
    for fit, test in ((0, 1), (1, 0)):
      xf, xt = rows(fit), rows(test)
      yf, yt = np.tile(pos[1:], (half == fit).sum()), np.tile(pos[1:], (half == test).sum())
      af = np.c_[xf, np.ones(len(xf))]
      lam = 1e-2 * np.trace(np.cov(xf.T, bias=True)) * len(xf) / p
      theta = np.linalg.solve(af.T @ af + np.diag([lam] * p + [0.0]), af.T @ yf)
      pred = np.c_[xt, np.ones(len(xt))] @ theta
      r2s.append(1 - ((yt - pred) ** 2).sum() / ((yt - yt.mean()) ** 2).sum())
      lams.append(lam)
    for got in (one, three):
      np.testing.assert_allclose(got["ridge_lambda"][l], lams[0], rtol=1e-4)
      np.testing.assert_allclose(got["r2"][l], np.mean(r2s), atol=1e-4)
      assert got["n_fit"][l] == (half == 0).sum() * (t - 1)
  assert float(one["r2"].min()) > 0.5


def test_probe_on_constant_features_reads_nothing():
  """Features that are constant up to float rounding (the residual part of log Z under flat attention)."""
  t = 16
  f = np.broadcast_to(np.log1p(np.arange(t))[None, None, :, None], (8, 1, t, 3)).astype(np.float32)
  f = f - np.log1p(np.arange(t)).astype(np.float32)[None, None, :, None] * (1 + 1e-7)
  out = probes.finalize(probes.update(probes.init(1, 3, K), jnp.asarray(f), jnp.arange(8)))
  np.testing.assert_allclose(out["r2"], 0.0, atol=1e-5)


def test_probe_finalize_holds_one_lu_solve():
  """Both halves' ridge systems go through one batched LU: two at once deadlocked XLA CPU's 2-thread pool."""
  acc = probes.init(3, 5, K)
  hlo = jax.jit(probes.finalize).lower(acc).compile().as_text()
  assert hlo.count("getrf") == 1, [line for line in hlo.splitlines() if "getrf" in line]


# --- position 0 -------------------------------------------------------------------

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


def test_probe_on_states_equal_up_to_rounding_reads_nothing():
  """Large features identical across positions up to float32 rounding (one repeated token through a real LM):
  constant by their relative scatter, so no weight on the rounding pattern and R^2 ~ 0, not -1e7."""
  t, d = 32, 64
  rng = np.random.default_rng(0)
  base = rng.normal(size=d).astype(np.float32) * 8.0
  f = base[None, None, None, :] * (1 + 1e-6 * rng.normal(size=(8, 1, t, d))).astype(np.float32)
  out = probes.finalize(probes.update(probes.init(1, d, K), jnp.asarray(f, jnp.float32), jnp.arange(8)))
  assert float(out["ridge_lambda"][0]) == np.float32(1e20) and abs(float(out["r2"][0])) < 1e-3
