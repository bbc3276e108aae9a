"""Estimators against brute-force NumPy and analytic expectations."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings, strategies as st

from abspos_jax.analysis import (denominators, fixed_effects as fe, leakage,
                                 position0, probes, sinks)


def mask(t: int, window: int | None = None) -> np.ndarray:
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  vis = j <= i
  return vis if window is None else vis & (j > i - window)


def attention(rng, b, l, h, t, visible, scale=2.0, offset=0.0):
  """Random logits ``[B, L, H, T, T]`` (-inf off the mask) and their ``log_z``."""
  vis = visible if visible.ndim == 2 else visible[:, None]
  s = offset + scale * rng.normal(size=(b, l, h, t, t)).astype(np.float32)
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


MASKS = [(7, None), (8, 3), (6, 6), (9, 1), (9, 4)]


@pytest.mark.parametrize("t,window", MASKS)
def test_fixed_effects_match_lstsq(t, window):
  rng = np.random.default_rng(t * 10 + (window or 0))
  vis = mask(t, window)
  x = rng.normal(size=(5, t, t)) + rng.normal(size=(t, 1))
  design = fe.make_design(vis)
  m = jnp.asarray(x.mean(0), jnp.float32)
  two = fe.fit_two_way(design, m)
  off = fe.fit_offset_only(design, m)
  fit_a, coef_a = lstsq_fit(vis, x, True)
  fit_b, _ = lstsq_fit(vis, x, False)
  np.testing.assert_allclose(two["fitted"], fit_a, atol=2e-5)
  np.testing.assert_allclose(off["fitted"], fit_b, atol=2e-5)
  np.testing.assert_allclose(two["phi"], np_phi(vis, coef_a[t:]), atol=2e-5)
  # The phi of the identified coefficients is centred on the cells.
  assert abs(float(fe.cell_mean_of_query_function(design, two["phi"]))) < 1e-5


@pytest.mark.parametrize("t,window", [(7, None), (8, 3)])
def test_heldout_r2_matches_numpy(t, window):
  rng = np.random.default_rng(1)
  vis = mask(t, window)
  n = 11
  seq_ids = rng.permutation(100)[:n]
  x = (rng.normal(size=(n, t, t)) + rng.normal(size=(t, 1))
       + 0.5 * rng.normal(size=(1, t, t)) + 30.0)  # large mean: exercises the reference
  design = fe.make_design(vis)
  acc = fe.heldout_init((t, t))
  for part in np.array_split(np.arange(n), 3):
    acc = jax.jit(fe.heldout_update)(acc, jnp.asarray(x[part], jnp.float32), vis,
                                     jnp.asarray(seq_ids[part]))
  got = fe.heldout_r2(design, acc)
  fit, test = x[seq_ids % 2 == 0], x[seq_ids % 2 == 1]
  y_test = np.concatenate([v[vis] for v in test])
  sst = ((y_test - y_test.mean()) ** 2).sum()
  for key, two_way in (("two_way", True), ("offset", False)):
    pred, _ = lstsq_fit(vis, fit, two_way)
    sse = sum(((v - pred)[vis] ** 2).sum() for v in test)
    np.testing.assert_allclose(got[key], 1.0 - sse / sst, atol=1e-4)


@settings(max_examples=15, deadline=None)
@given(t=st.integers(2, 10), window=st.one_of(st.none(), st.integers(1, 10)),
       seed=st.integers(0, 2**16))
def test_query_function_and_linearity(t, window, seed):
  rng = np.random.default_rng(seed)
  vis = mask(t, window)
  design = fe.make_design(vis)
  f = rng.normal(size=t)
  x_f = np.where(vis, f[:, None], 0.0)
  phi_f = fe.fit_two_way(design, jnp.asarray(x_f, jnp.float32))["phi"]
  np.testing.assert_allclose(phi_f, np_phi(vis, f), atol=1e-5)
  np.testing.assert_allclose(fe.query_function_effect(design, jnp.asarray(f, jnp.float32)),
                             np_phi(vis, f), atol=1e-6)
  x, y = (jnp.asarray(rng.normal(size=(t, t)), jnp.float32) for _ in range(2))
  phi = lambda m: fe.fit_two_way(design, m)["phi"]
  np.testing.assert_allclose(phi(x + y), phi(x) + phi(y), atol=1e-5)
  # A pure offset function has no query effect.
  g = rng.normal(size=t)
  x_g = jnp.asarray(g[np.clip(np.subtract.outer(np.arange(t), np.arange(t)), 0, t - 1)],
                    jnp.float32)
  np.testing.assert_allclose(phi(x_g), 0.0, atol=1e-5)


def test_make_design_rejects_bad_masks():
  with pytest.raises(ValueError, match="causal"):
    fe.make_design(np.ones((4, 4), bool))
  bad = mask(4)
  bad[2] = False
  with pytest.raises(ValueError, match="visible key"):
    fe.make_design(bad)
  stacked = fe.make_design(np.stack([mask(5), mask(5, 2), mask(5)]))
  assert stacked.normal_pinv.shape == (3, 10, 10)


# --- leakage ------------------------------------------------------------------

L, H, T = 2, 3, 8
VIS_LG = np.stack([mask(T, 3), mask(T)])  # one local, one global layer


def run_leakage(logits, log_z, seq_ids, visible, parts=1, early_max=4):
  acc = leakage.init(logits.shape[1], logits.shape[2], logits.shape[-1])
  upd = jax.jit(leakage.update)
  for p in np.array_split(np.arange(len(seq_ids)), parts):
    acc = upd(acc, logits[p], log_z[p], jnp.asarray(seq_ids[p]), visible)
  return leakage.finalize(acc, fe.make_design(visible), early_max=early_max)


def np_components(vis, s, log_z, queries):
  """Brute-force split for one (layer, head): s [N, T, T], log_z [N, T]."""
  loga = np.where(vis, s - log_z[..., None], 0.0)
  _, coef = lstsq_fit(vis, np.where(vis, s, 0.0), True)
  t = vis.shape[0]
  qc = vis.sum(1)
  log_v = np.log(qc)
  phi_s = np_phi(vis, coef[t:])
  phi_e = np_phi(vis, log_z.mean(0) - log_v)
  phi_v = np_phi(vis, log_v)
  phi_a = phi_s - phi_e - phi_v
  w = qc * queries
  c = lambda f: f - (w * f).sum() / w.sum()
  cov = lambda a, b: (w * c(a) * c(b)).sum() / w.sum()
  cells = vis & queries[:, None]
  obs = np.concatenate([v[cells] for v in loga])
  return dict(phi_loga=phi_a, var_phi=cov(phi_a, phi_a), cov_mask=cov(phi_a, -phi_v),
              cov_res=cov(phi_a, phi_s - phi_e), var_total=obs.var())


def test_leakage_components_match_numpy_and_add_up():
  rng = np.random.default_rng(2)
  n = 10
  s, log_z = attention(rng, n, L, H, T, VIS_LG)
  s = s + np.linspace(0, 2, T, dtype=np.float32)[:, None]  # a query effect in s
  ids = np.arange(n) + 3
  out = run_leakage(s, log_z, ids, VIS_LG)
  q = np.arange(T)
  for l in range(L):
    for h in range(H):
      for prefix, queries in (("", np.ones(T, bool)), ("early_", (q >= 1) & (q < 4))):
        ref = np_components(VIS_LG[l], s[:, l, h], log_z[:, l, h], queries)
        for k in ("var_phi", "cov_mask", "cov_res", "var_total"):
          np.testing.assert_allclose(out[prefix + k][l, h], ref[k], rtol=1e-4, atol=1e-6)
      np.testing.assert_allclose(out["phi_loga"][l, h], ref["phi_loga"], atol=1e-5)
  assert float(out["phi_identity_err"].max()) < 1e-5
  for prefix in ("", "early_"):
    for scope in ("", "_layer", "_overall"):
      total = out[prefix + "share_mask" + scope] + out[prefix + "share_res" + scope]
      np.testing.assert_allclose(total, 1.0, atol=1e-5)
  np.testing.assert_allclose(out["cov_mask_layer"], out["cov_mask"].mean(-1), rtol=1e-6)
  np.testing.assert_allclose(out["share_res_layer"],
                             out["cov_res"].mean(-1) / out["var_phi"].mean(-1), rtol=1e-5)
  assert out["leakage_s"].shape == (L, H) and out["leakage_loga_overall"].shape == ()


def test_leakage_heldout_matches_fixed_effects():
  rng = np.random.default_rng(3)
  n = 9
  s, log_z = attention(rng, n, L, H, T, VIS_LG)
  ids = rng.permutation(50)[:n]
  out = run_leakage(s, log_z, ids, VIS_LG)
  for l in range(L):
    design = fe.make_design(VIS_LG[l])
    acc = fe.heldout_init((T, T))
    loga = np.where(VIS_LG[l], s[:, l, 1] - log_z[:, l, 1, :, None], 0.0)
    acc = fe.heldout_update(acc, jnp.asarray(loga), VIS_LG[l], jnp.asarray(ids))
    r2 = fe.heldout_r2(design, acc)
    np.testing.assert_allclose(out["leakage_loga"][l, 1], r2["two_way"] - r2["offset"],
                               atol=1e-5)
  np.testing.assert_allclose(out["leakage_s_layer"], out["leakage_s"].mean(-1), atol=1e-6)


def test_leakage_accumulates_over_batches():
  rng = np.random.default_rng(4)
  n = 12
  s, log_z = attention(rng, n, L, H, T, VIS_LG, offset=5.0)
  ids = np.arange(n)
  one = run_leakage(s, log_z, ids, VIS_LG, parts=1)
  three = run_leakage(s, log_z, ids, VIS_LG, parts=3)
  for k in one:
    np.testing.assert_allclose(three[k], one[k], atol=1e-5, rtol=1e-5, err_msg=k)


def test_zero_logits_are_all_mask():
  n = 4
  vis = mask(T)
  s = np.where(vis, 0.0, -np.inf).astype(np.float32)
  s = np.broadcast_to(s, (n, L, H, T, T))
  log_z = jax.nn.logsumexp(jnp.asarray(s), axis=-1)
  # Exact in float32: logsumexp of zeros is log(float32 |V(i)|), as log_visible computes it.
  np.testing.assert_array_equal(log_z, np.broadcast_to(denominators.log_visible(vis), log_z.shape))
  out = run_leakage(s, log_z, np.arange(n), vis)
  for prefix in ("", "early_"):
    np.testing.assert_allclose(out[prefix + "cov_res"], 0.0, atol=1e-7)
    np.testing.assert_allclose(out[prefix + "share_mask"], 1.0, atol=1e-6)
    assert float(out[prefix + "var_phi"].min()) > 0
  np.testing.assert_allclose(out["phi_s"], 0.0, atol=1e-7)
  np.testing.assert_allclose(out["phi_E"], 0.0, atol=1e-7)
  acc = denominators.update(denominators.init(L, H, T), s, log_z, vis)
  den = denominators.finalize(acc, vis)
  np.testing.assert_array_equal(den["log_z"], np.broadcast_to(den["log_visible"], (L, H, T)))
  np.testing.assert_allclose(den["excess"], 0.0, atol=1e-7)
  np.testing.assert_allclose(den["log_z_slope"], 1.0, atol=1e-5)


def test_sliding_window_mask_term_constant_past_window():
  w = 3
  rng = np.random.default_rng(5)
  vis = mask(T, w)
  s, log_z = attention(rng, 4, 1, 2, T, vis)
  out = run_leakage(s, log_z, np.arange(4), vis)
  phi_v = np.asarray(out["phi_logV"][0])
  np.testing.assert_allclose(phi_v[w - 1:], phi_v[w - 1], atol=1e-7)
  assert np.all(np.diff(phi_v[:w]) > 0)


def test_fraction_removed():
  got = leakage.fraction_removed(jnp.array([2.0, 0.0, -1.0]), jnp.array([0.5, 1.0, -0.25]))
  np.testing.assert_allclose(got, [0.75, np.nan, 0.75])


# --- denominators -------------------------------------------------------------

def test_denominators_match_numpy_and_accumulate():
  rng = np.random.default_rng(6)
  n = 9
  s, log_z = attention(rng, n, L, H, T, VIS_LG, offset=20.0)
  acc1 = denominators.update(denominators.init(L, H, T), s, log_z, VIS_LG)
  acc3 = denominators.init(L, H, T)
  for p in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(denominators.update)(acc3, s[p], log_z[p], VIS_LG)
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
  np.testing.assert_allclose(one["log_visible"], log_v, atol=1e-7)
  # Slope: the local layer (W = 3) uses queries 0..2 only, the global layer all.
  for l, k in ((0, 3), (1, T)):
    for h in range(H):
      slope = np.polyfit(log_v[l, :k], log_z.mean(0)[l, h, :k], 1)[0]
      np.testing.assert_allclose(one["log_z_slope"][l, h], slope, rtol=1e-4, atol=1e-5)
  assert np.isnan(denominators.finalize(acc1, np.stack([mask(T, 1)] * L))["log_z_slope"]).all()


# --- sinks ----------------------------------------------------------------------

def test_sink_statistics():
  mass = np.zeros((2, 3, 10), np.float32)
  mass[0, 1, 4:] = 0.5
  mass[1, 2, :4] = 1.0  # early queries do not count
  mass[1, 0, 4:] = 0.31
  out = sinks.sink_statistics(jnp.asarray(mass))
  np.testing.assert_allclose(out["sink_score"][0, 1], 0.5)
  np.testing.assert_array_equal(out["sink_heads"], [[0, 1, 0], [1, 0, 0]])
  np.testing.assert_allclose(out["sink_rate"], [1 / 3, 1 / 3])
  np.testing.assert_allclose(out["sink_score_max"], 0.5)


# --- probes ---------------------------------------------------------------------

def test_ridge_probe_matches_normal_equations():
  rng = np.random.default_rng(7)
  n, nl, t, p = 10, 2, 12, 5
  pos = np.log1p(np.arange(t))
  f = rng.normal(size=(n, nl, t, p)) * np.array([1.0, 10.0, 0.1, 1.0, 1.0])
  f[..., 0] += 5.0 * pos  # a readable position signal
  f += 50.0
  ids = np.arange(n) * 3
  acc1 = probes.update(probes.init(nl, p), jnp.asarray(f, jnp.float32), jnp.asarray(ids))
  acc3 = probes.init(nl, p)
  for part in np.array_split(np.arange(n), 3):
    acc3 = jax.jit(probes.update)(acc3, jnp.asarray(f[part], jnp.float32),
                                  jnp.asarray(ids[part]))
  one, three = probes.finalize(acc1), probes.finalize(acc3)
  for l in range(nl):
    rows = lambda k: f[ids % 2 == k, l, 1:].reshape(-1, p)
    xf, xt = rows(0), rows(1)
    yf = np.tile(pos[1:], (ids % 2 == 0).sum())
    yt = np.tile(pos[1:], (ids % 2 == 1).sum())
    af = np.c_[xf, np.ones(len(xf))]
    lam = 1e-2 * np.trace(np.cov(xf.T, bias=True)) * len(xf) / p
    theta = np.linalg.solve(af.T @ af + np.diag([lam] * p + [0.0]), af.T @ yf)
    pred = np.c_[xt, np.ones(len(xt))] @ theta
    r2 = 1 - ((yt - pred) ** 2).sum() / ((yt - yt.mean()) ** 2).sum()
    for got in (one, three):
      np.testing.assert_allclose(got["ridge_lambda"][l], lam, rtol=1e-4)
      np.testing.assert_allclose(got["r2"][l], r2, atol=1e-4)
      assert got["n_fit"][l] == len(xf)
  assert float(one["r2"].min()) > 0.5


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
