"""analyze() (analysis/orchestrator.py) on constructed models with known answers: mask-only denominators,
residual-stream terms, closedness; batches, user statistics at hook points, bad inputs."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import attention, model as model_lib
from abspos_jax.analysis import AnalysisOptions, Statistic, analyze
from abspos_jax.analysis.estimators import denominators
from abspos_jax.data import BOS_ID
from abspos_jax.hooks import Hooks
from conftest import small_config
from helpers import FAST, sequences, summary_numbers, zero_qk


@pytest.mark.parametrize("position", ["rope", "swa"])
def test_zero_qk_gives_mask_only_denominators(position):
  r = analyze(zero_qk(model_lib.create(small_config(position))), sequences(), options=FAST)
  np.testing.assert_allclose(r.stats["log_z"], np.broadcast_to(r.stats["log_visible"], r.stats["log_z"].shape),
                             atol=1e-5)
  c = r.summary["components"]
  assert abs(c["pooled"]["residual_stream"]) < 1e-4 and abs(c["pooled"]["causal_mask"] - 1) < 1e-4
  d = r.summary["denominators"]
  np.testing.assert_allclose(d["excess_mean_layer"], 0.0, atol=1e-5)
  np.testing.assert_allclose(d["excess_mean_layer_ci"], 0.0, atol=1e-5)  # no input changes anything
  np.testing.assert_allclose(d["log_z_slope_layer"], 1.0, atol=1e-4)
  np.testing.assert_allclose(d["log_z_slope_layer_ci"], 1.0, atol=1e-4)
  # Flat weights: a_i0 = 1 / |V(i)| at the queries 1 <= i < W (all of them without a window) that see key 0.
  seen = np.arange(1, 16 if position == "rope" else 4)
  np.testing.assert_allclose(d["sink_mass_mean_layer"], np.mean(1.0 / (seen + 1)), atol=1e-5)
  # The raw attention features are functions of the mask here (v1's probe: R^2 1.0000); the mask-free one reads nothing.
  # (under a window of 4 keys the features stop changing at i = 3, so they read less).
  assert min(r.summary["probes"]["attention_raw_r2"]) > (0.99 if position == "rope" else 0.5)
  np.testing.assert_allclose(r.summary["probes"]["attention_r2"], 0.0, atol=1e-4)


@pytest.mark.parametrize("init_std", [0.1, 0.3])
def test_repeated_token_without_bos_has_no_residual_stream_component(init_std):
  """One token repeated, no BOS, one RoPE layer: logits depend on i - j alone (v1: residual share 0.21 / 0.78)."""
  m = model_lib.create(small_config(**{"model.num_layers": 1, "model.init_std": init_std}))
  toks = np.full((8, 16), 65, np.int32)
  c = analyze(m, {"none": toks}, main="none", options=FAST).summary["components"]
  assert abs(c["pooled"]["residual_stream"]) < 1e-3 and abs(c["pooled"]["causal_mask"] - 1) < 1e-3, c["pooled"]
  assert abs(c["pooled_early"]["residual_stream"]) < 1e-3
  assert c["pooled"]["residual_stream_var"] < 1e-3 * c["pooled"]["causal_mask_var"]


def _clearly_positive(pooled, key):
  lo, hi = pooled[key + "_ci"]
  return lo > 0 and lo <= pooled[key] <= hi


def test_learned_absolute_positions_are_residual_stream():
  """The repeated-token model with learned positions: logits depend on (i, j), not on i - j alone."""
  m = model_lib.create(small_config("learned", **{"model.num_layers": 1, "model.init_std": 0.3}))
  toks = np.full((8, 16), 65, np.int32)
  pooled = analyze(m, {"none": toks}, main="none", options=FAST).summary["components"]["pooled"]
  assert _clearly_positive(pooled, "residual_stream_var"), pooled
  assert pooled["residual_stream_var"] > 0.3 * pooled["causal_mask_var"], pooled  # measured 2.2x / 0.8x


def test_a_distinct_token_at_position_0_is_residual_stream():
  """The control of the repeated-token test with BOS at position 0: key 0 gets its own logit, an absolute term."""
  m = model_lib.create(small_config(**{"model.num_layers": 1, "model.init_std": 0.3}))
  toks = np.full((8, 16), 65, np.int32)
  toks[:, 0] = BOS_ID
  pooled = analyze(m, {"prepend": toks}, options=FAST).summary["components"]["pooled"]
  assert _clearly_positive(pooled, "residual_stream_var"), pooled
  assert pooled["residual_stream_var"] > 0.3 * pooled["causal_mask_var"], pooled  # measured 2.2x / 0.8x


def test_sliding_window_mask_term_constant_after_window():
  r = analyze(model_lib.create(small_config("swa")), sequences(), options=FAST)
  w = 4
  phi = r.stats["phi_zmask"]  # [L, H, T]: a function of n(i) = min(i + 1, W)
  np.testing.assert_allclose(phi[..., w - 1:], np.broadcast_to(phi[..., w - 1:w], phi[..., w - 1:].shape), atol=1e-5)
  assert np.ptp(phi[..., :w]) > 0.5
  assert all(len(ci) == 2 for ci in r.summary["components"]["residual_stream_ci"])


def test_closedness_and_fingerprint():
  r = analyze(model_lib.create(small_config()), sequences(), options=FAST)
  assert r.summary["closedness_max_abs_diff"] == 0.0
  assert max(r.summary["fingerprint"]["bos"]) < 1e-6
  assert min(r.summary["fingerprint"]["no_bos"]) > 0.1
  assert r.summary["fingerprint"]["no_bos_num_groups"] > 1


@pytest.mark.parametrize("batch_size", [6, 1])
def test_closedness_catches_a_broken_mask(monkeypatch, batch_size):
  """With every key visible in the model, h_0 reads later tokens: the check, on one sequence per batch, must see it.

  With a batch of one sequence there is no other sequence to take tokens from (v1 compared the sequence with itself).
  """
  everything = types.SimpleNamespace(visible=lambda q, k, window=None: jnp.ones((q.shape[0], k.shape[0]), bool))
  monkeypatch.setattr(attention, "masks", everything)  # the model's mask only; the estimators keep the causal one
  options = AnalysisOptions(batch_size=batch_size, interventions=False, progress=False, closedness_sequences=1)
  per_layer = analyze(model_lib.create(small_config()), sequences(), options=options).summary["closedness_per_layer"]
  assert per_layer[0] == 0.0  # the embedding output reads token 0 only
  assert min(per_layer[1:]) > 1e-3, per_layer


def test_batches_and_query_blocks_accumulate_like_one_batch():
  """4 sequences per batch with every layer's attention 4 queries at a time (``query_block``, the statistics folded
  block by block) against one batch of 12 with all 16 queries at once: every summary number and stats array equal
  to float32 rounding. (``sink_ablate``'s edit on blocks of queries: tests/test_steps.py.)"""
  m, seqs = model_lib.create(small_config("swa", **{"model.layer_pattern": "LG"})), sequences()
  small = analyze(m, seqs, options=AnalysisOptions(batch_size=4, query_block=4, interventions=False, progress=False))
  whole = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False))
  assert (small.summary["memory"]["query_block"], whole.summary["memory"]["query_block"]) == (4, 16)
  assert (small.summary["batch_size"], whole.summary["batch_size"]) == (4, 12)
  numbers = lambda r: summary_numbers({**r.summary, "batch_size": None})  # noqa: E731
  np.testing.assert_allclose(numbers(small), numbers(whole), rtol=1e-4, atol=1e-5)
  for name in whole.stats:
    np.testing.assert_allclose(small.stats[name], whole.stats[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_user_statistic_at_a_hook_point():
  def update(acc, cap):
    return acc + jnp.sum(cap["blocks.0.mlp.out"] ** 2)
  stat = Statistic(points=("blocks.0.mlp.out",), init=lambda: jnp.zeros(()), update=update,
                   finalize=lambda acc: {"mlp0_sq": acc})
  m, seqs = model_lib.create(small_config()), sequences()
  r = analyze(m, {"prepend": seqs["prepend"]}, statistics={"mlp0": stat}, options=FAST)
  hooks = Hooks(capture=["blocks.0.mlp.out"])
  m(jnp.asarray(seqs["prepend"]), hooks=hooks)
  np.testing.assert_allclose(r.user["mlp0"]["mlp0_sq"], float(jnp.sum(hooks.cache["blocks.0.mlp.out"] ** 2)),
                             rtol=1e-5)


def test_bad_inputs():
  m = model_lib.create(small_config())
  with pytest.raises(ValueError, match="main policy"):
    analyze(m, {"none": sequences()["none"]}, options=FAST)
  with pytest.raises(ValueError, match=r"\[N >= 2, T\]"):
    analyze(m, {"prepend": sequences()["prepend"][:1]}, options=FAST)
  with pytest.raises(ValueError, match=r"AnalysisOptions.num_blocks\) must be an even number"):
    analyze(m, sequences(), options=AnalysisOptions(interventions=False, progress=False, num_blocks=5))
  with pytest.raises(ValueError, match=r"AnalysisOptions.closedness_sequences\) must be >= 1"):
    analyze(m, sequences(), options=AnalysisOptions(interventions=False, progress=False, closedness_sequences=0))
  learned = model_lib.create(small_config("learned"))
  with pytest.raises(ValueError, match="exceed the 16 learned positions"):
    analyze(learned, sequences(t=20), options=FAST)


def test_denominator_picture_carries_jackknife_intervals():
  """Per-layer slope, excess, max weight and key-0 weight: an interval around each value, from the blocks."""
  r = analyze(model_lib.create(small_config(**{"model.init_std": 0.3})), sequences(n=16), options=FAST)
  d = r.summary["denominators"]
  for name in denominators.LAYER_MEANS:
    values, cis = np.array(d[name]), np.array(d[name + "_ci"])
    assert values.shape == (2,) and cis.shape == (2, 2), name
    assert np.all(cis[:, 0] < values) and np.all(values < cis[:, 1]), (name, values, cis)
  # the same means as the [layer, head, query] arrays in stats.npz
  np.testing.assert_allclose(d["excess_mean_layer"], r.stats["excess"].mean((1, 2)), rtol=1e-5)
  np.testing.assert_allclose(d["sink_mass_mean_layer"], r.stats["sink_mass"][:, :, 1:].mean((1, 2)), rtol=1e-5)


def test_fewer_sequences_than_blocks_allocate_fewer_blocks_with_the_same_numbers(monkeypatch):
  """6 sequences with num_blocks 16: sequence i is in block i % 6 == i % 16, so 6 blocks give every number of
  the summary 16 blocks give (10 of them empty), with accumulators and jackknife evaluations 6/16 the size."""
  from abspos_jax.analysis.estimators import intervals
  m = model_lib.create(small_config())
  seqs = sequences(n=6)
  options = AnalysisOptions(batch_size=6, num_blocks=16, progress=False)
  few = analyze(m, seqs, options=options).summary
  assert few["intervals"]["num_blocks"] == 6 and few["intervals"]["nonempty_blocks"] == 6
  monkeypatch.setattr(intervals, "blocks_for", lambda n, k: k)  # every block of the request, as before
  every = analyze(m, seqs, options=options).summary
  assert every["intervals"]["num_blocks"] == 16 and every["intervals"]["nonempty_blocks"] == 6
  numbers = lambda s: summary_numbers({**s, "intervals": None})  # noqa: E731  all but the blocks allocated
  np.testing.assert_allclose(numbers(few), numbers(every), rtol=1e-5, atol=1e-6, equal_nan=True)
