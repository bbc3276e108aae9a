"""The analysis pass on constructed models with known answers, its API, CLI and bad inputs."""

import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from abspos_jax import attention, model as model_lib
from abspos_jax.analysis import AnalysisOptions, Statistic, analyze, analyze_run
from abspos_jax.analysis.estimators import denominators, fixed_effects, leakage
from abspos_jax.analysis.passes import memory, steps
from abspos_jax.analysis.core import fingerprint_groups, layer_visible
from abspos_jax.data import BOS_ID
from abspos_jax.hooks import Hooks
from abspos_jax.train_loop import train
from conftest import small_config, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = AnalysisOptions(batch_size=6, interventions=False, progress=False)


def sequences(n=12, t=16, seed=0):
  rng = np.random.default_rng(seed)
  none = rng.integers(0, 256, (n, t)).astype(np.int32)
  prepend = none.copy()
  prepend[:, 0] = BOS_ID
  return {"prepend": prepend, "none": none}


def zero_qk(model):
  for block in model.blocks:
    block.attn.wq[...] = jnp.zeros_like(block.attn.wq[...])
    block.attn.wk[...] = jnp.zeros_like(block.attn.wk[...])
  return model


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


def test_layer_by_layer_folding_equals_all_layers_at_once():
  """``fold_pass`` (each layer folded as it runs) against the estimators on every layer's captured logits.

  Local and global layers alternate, so each layer has its own design slice.
  """
  m = model_lib.create(small_config("swa", **{"model.num_layers": 3, "model.layer_pattern": "LG"}))
  toks = jnp.asarray(sequences()["prepend"][:6])
  ids = jnp.arange(6) + 3
  visible = layer_visible(m.spec, toks.shape[1])
  design = fixed_effects.make_design(visible)
  L, H, T = m.spec.num_layers, m.spec.num_heads, toks.shape[1]
  hooks = Hooks(capture=lambda name: name.startswith("blocks.") and name.endswith(("logits", "log_z")))
  m(toks, hooks=hooks)
  logits = jnp.stack([hooks.cache[f"blocks.{l}.attn.logits"] for l in range(L)], 1)
  log_z = jnp.stack([hooks.cache[f"blocks.{l}.attn.log_z"] for l in range(L)], 1)
  start = {"leakage": leakage.init(L, H, T, 4), "denominators": denominators.init(L, H, T, 4)}
  for _ in range(2):  # the second batch reads the first one's references
    want_lk, want_zres, _ = leakage.update(start["leakage"], logits, log_z, ids, design)
    want_den = denominators.update(start["denominators"], logits, log_z, visible, ids)
    got, _, zres, qstats = jax.jit(lambda a: steps.fold_pass(m, a, toks, ids, design))(start)
    for want, have in ((want_lk, got["leakage"]), (want_den, got["denominators"]), (want_zres, zres)):
      jax.tree.map(lambda w, h: np.testing.assert_allclose(h, w, rtol=1e-5, atol=1e-5), want, have)
    np.testing.assert_allclose(qstats["entropy"], denominators.query_statistics(logits, log_z, visible)["entropy"],
                               rtol=1e-5, atol=1e-6)
    start = got


def test_the_other_policy_step_equals_the_baseline_steps_position0_closedness_and_loss():
  """The non-main BOS policy runs a plain forward; its fingerprint, closedness and loss sums are the full step's."""
  m = model_lib.create(small_config())
  toks = jnp.asarray(sequences()["none"][:6])
  graphdef, params = nnx.split(m, nnx.Param)
  _, x0_groups = fingerprint_groups({"none": np.asarray(toks)}, m.spec.vocab_size)
  design = fixed_effects.make_design(layer_visible(m.spec, toks.shape[1]))
  full = jax.jit(steps.make_baseline_step(graphdef, design, {}, jnp.asarray(x0_groups)))
  light = jax.jit(steps.make_position0_step(graphdef, jnp.asarray(x0_groups)))
  groups = int(x0_groups.max()) + 1
  want = steps.init_accumulators(m.spec, toks.shape[1], {}, 4, num_groups=groups)
  got = steps.init_position0_pass(m.spec, groups)
  assert set(got) == {"position0", "closedness", "loss_sum", "loss_count"}
  for ids in (jnp.arange(3), jnp.arange(3, 6)):  # the first batch runs the closedness check, the second skips it
    want = full(params, want, toks[ids], ids)
    got = light(params, got, toks[ids], ids)
    jax.tree.map(lambda w, h: np.testing.assert_allclose(h, w, rtol=1e-5, atol=1e-6),
                 {k: want[k] for k in got}, got)
  assert float(got["closedness"].max()) == 0.0 and float(got["loss_count"]) == 6 * (toks.shape[1] - 1)


def test_the_pass_holds_one_layer_of_logits():
  """Compiled scratch memory of the baseline step: flat in depth (before folding: +100 MiB from 2 to 8 layers)."""
  def scratch_mib(num_layers):
    m = model_lib.create(small_config(**{"model.num_layers": num_layers, "data.seq_len": 256}))
    graphdef, params = nnx.split(m, nnx.Param)
    design = fixed_effects.make_design(layer_visible(m.spec, 256))
    step = steps.make_baseline_step(graphdef, design, {})
    acc = steps.init_accumulators(m.spec, 256, {}, 16)
    compiled = jax.jit(step).lower(params, acc, jnp.zeros((8, 256), jnp.int32), jnp.arange(8)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20

  one_layer = 8 * 4 * 256 * 256 * 4 / 2**20  # [B, H, T, T] float32: 8 MiB
  assert scratch_mib(8) - scratch_mib(2) < one_layer


def test_choose_batch_size_from_a_linear_memory_model():
  """A step that allocates ``100 + 10 B`` bytes: budget 165 -> B = 6 (160 bytes), 2 compilations plus the check."""
  compiled = []

  def compile_for(b):
    compiled.append(b)
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        temp_size_in_bytes=100 + 10 * b, output_size_in_bytes=7, alias_size_in_bytes=7))

  assert memory.choose_batch_size(compile_for, 32, 165) == (6, 160) and compiled == [32, 1, 6]
  assert memory.choose_batch_size(compile_for, 32, 10**6) == (32, 420)
  with pytest.raises(ValueError, match="one sequence does not fit.*memory_budget_gb"):
    memory.choose_batch_size(compile_for, 32, 109)


def test_the_batch_holds_at_most_256_mib_of_one_layers_logits():
  """[B, H, T, T] float32 within 256 MiB: 12 heads at 1,024 tokens -> 5 sequences, at 2,048 -> 1, never 0."""
  assert memory.logits_batch_cap(12, 1024) == 5
  assert memory.logits_batch_cap(12, 2048) == 1 and memory.logits_batch_cap(32, 8192) == 1
  assert memory.logits_batch_cap(4, 128) == 1024


def test_memory_budget_sets_the_batch_size():
  m, seqs = model_lib.create(small_config()), sequences()
  whole = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False))
  assert whole.summary["batch_size"] == 12
  budget = 0.6 * whole.summary["memory"]["step_gib"]
  small = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False,
                                                   memory_budget_gb=budget))
  assert 1 <= small.summary["batch_size"] < 12 and small.summary["memory"]["step_gib"] <= budget
  for name in ("log_z", "phi_s", "share_res", "probe_resid_r2"):
    np.testing.assert_allclose(small.stats[name], whole.stats[name], rtol=1e-4, atol=1e-5, err_msg=name)
  with pytest.raises(ValueError, match="one sequence does not fit"):
    analyze(m, seqs, options=AnalysisOptions(interventions=False, progress=False, memory_budget_gb=1e-6))


def test_batches_accumulate_like_one_batch():
  m, seqs = model_lib.create(small_config()), sequences()
  small = analyze(m, seqs, options=AnalysisOptions(batch_size=4, interventions=False, progress=False))
  whole = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False))
  for name in ("log_z", "log_z_std", "sink_mass", "phi_s", "phi_zres", "share_res", "share_res_lo", "pos0_norm",
               "probe_resid_r2", "probe_attn_r2"):
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


def test_interventions_with_known_answers():
  """Replacing BOS by BOS's own embedding, or patching position 0 from another BOS input, changes nothing."""
  m, seqs = model_lib.create(small_config()), sequences()
  opts = AnalysisOptions(batch_size=6, progress=False, bos_replace_token=BOS_ID)
  iv = analyze(m, {"prepend": seqs["prepend"]}, options=opts).summary["interventions"]
  for entry in (iv["bos_replace"]["token"], iv["pos0_patch"]):
    for key in ("causal_mask_change", "residual_stream_change", "residual_stream_change_early"):
      assert abs(entry[key]) < 1e-6, (key, entry[key])
      lo, hi = entry[key + "_ci"]
      assert lo <= entry[key] <= hi
    for comp in ("causal_mask", "residual_stream"):
      removed, (lo, hi) = entry[f"{comp}_removed"], entry[f"{comp}_before_ci"]
      if removed is None:  # only where the component before is not clearly non-zero, and then with the reason
        assert entry[f"{comp}_removed_reason"]
      else:
        assert abs(removed) < 1e-4 and (lo > 0 or hi < 0), (comp, removed, lo, hi)
      if lo <= 0 <= hi:
        assert removed is None
  heads = iv["sink_ablate"]["heads"]
  assert [l for l, _ in heads] == [0, 1]  # no head reads the sink: the top head of each layer
  # Layer 0 sees only the embeddings: its other heads keep their sink mass, the ablated one has none.
  mass = analyze(m, {"prepend": seqs["prepend"]}, options=FAST).stats["sink_mass"][0][:, 4:].mean(-1)
  kept = np.delete(mass, heads[0][1])
  np.testing.assert_allclose(iv["sink_ablate"]["sink_mass_after"][0], kept.sum() / len(mass), rtol=1e-5)


def test_sink_ablate_on_a_flat_model_removes_no_residual_stream():
  """Zero query weights: no residual-stream component before, so none to remove (v1: 0.25 removed, = 1/H)."""
  iv = analyze(zero_qk(model_lib.create(small_config())), sequences(),
               options=AnalysisOptions(batch_size=6, progress=False)).summary["interventions"]
  sa = iv["sink_ablate"]
  for suffix in ("", "_early"):
    assert sa[f"residual_stream_removed{suffix}"] is None and "not clearly non-zero" in sa[
        f"residual_stream_removed{suffix}_reason"]
    assert abs(sa[f"residual_stream_change{suffix}"]) < 1e-6 and abs(sa[f"residual_stream_before{suffix}"]) < 1e-6


def test_bos_replace_needs_a_bos():
  m, seqs = model_lib.create(small_config()), sequences()
  iv = analyze(m, {"none": seqs["none"]}, main="none",
               options=AnalysisOptions(batch_size=6, progress=False)).summary["interventions"]
  assert set(iv["bos_replace"]) == {"skipped"} and "position 0 holds a text token" in iv["bos_replace"]["skipped"]
  assert "residual_stream_change" in iv["pos0_patch"] and "residual_stream_change" in iv["sink_ablate"]


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


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  d = tmp_path_factory.mktemp("run")
  train(small_config(**{"data.name": "synthetic", "data.synthetic_docs": 200}), str(d))
  return d


def test_cli_writes_every_output(run_dir, tmp_path):
  out = tmp_path / "analysis"
  r = subprocess.run([sys.executable, "analyze.py", f"--workdir={run_dir}", f"--out={out}", "--num_sequences=8",
                      "--batch_size=4", "--closedness_sequences=2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  names = set(os.listdir(out))
  assert {"summary.json", "stats.npz", "report.md", "log_z.png", "sink_mass.png", "position0.png", "fingerprint.png",
          "components.png", "interventions.png"} <= names
  s = json.loads((out / "summary.json").read_text())
  L = 2
  assert len(s["sink_rate"]) == L and len(s["fingerprint"]["bos"]) == L + 1 and len(s["fingerprint"]["no_bos"]) == L + 1
  for key in ("causal_mask", "residual_stream", "causal_mask_early", "residual_stream_early"):
    assert len(s["components"][key]) == L
  assert s["closedness_max_abs_diff"] == 0.0 and s["meta"]["step"] == 4
  assert s["meta"]["options"]["closedness_sequences"] == 2
  for name in ("bos_replace", "pos0_patch", "sink_ablate"):
    assert name in s["interventions"]
  stats = np.load(out / "stats.npz")
  assert stats["tokens"].shape == (8, 16) and (stats["tokens"][:, 0] == BOS_ID).all()
  assert stats["log_z"].shape == (L, 4, 16) and stats["sink_mass"].shape == (L, 4, 16)
  assert stats["log_visible"].shape == (16,) and stats["pos0_norm"].shape == (L + 1,)
  assert "![log_z.png](log_z.png)" in (out / "report.md").read_text()
  cmp = subprocess.run([sys.executable, "analyze.py", "--compare", str(out), str(out), f"--out={tmp_path / 'cmp'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert cmp.returncode == 0, cmp.stderr[-2000:]
  rows = [l.split(" | ") for l in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
          if l.startswith("| ") and not l.startswith("| group")]
  assert len(rows) == 1 and rows[0][1] == "2", rows  # the run twice: one group of two
  assert rows[0][2] == f"{s['loss'][s['main_policy']]:.3f} ± 0.000"  # its loss, no spread


def test_cli_bad_inputs_write_nothing(run_dir, tmp_path):
  def fails(*args, match):
    r = subprocess.run([sys.executable, "analyze.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and match in r.stderr, r.stderr[-2000:]
  fails(f"--workdir={tmp_path / 'missing'}", match="does not exist")
  fails(f"--workdir={tmp_path}", match="is not an abspos_jax run")
  fails(f"--workdir={run_dir}", "--step=3", f"--out={tmp_path / 'a'}", match="available steps: [2, 4]")
  fails(f"--workdir={run_dir}", "--num_sequences=0", f"--out={tmp_path / 'b'}", match="--num_sequences must be >= 2")
  fails(f"--workdir={run_dir}", "--seq_len=64", f"--out={tmp_path / 'c'}", match="longer than the 16 tokens")
  (tmp_path / "file").write_text("x")
  fails(f"--workdir={run_dir}", f"--out={tmp_path / 'file' / 'analysis'}", match="cannot write there")
  assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.slow
def test_checkpoint_from_8_devices_analyses_on_one(tmp_path):
  env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
  cmd = [sys.executable, "train.py", "--config=configs/rope.py", f"--workdir={tmp_path}",
         "--config.mesh.shape=(2,2,2)", "--config.mesh.axes=('data','fsdp','tensor')", "--config.model.num_layers=2",
         "--config.model.d_model=32", "--config.data.seq_len=16", "--config.train.batch_size=8",
         "--config.train.steps=2", "--config.train.progress=False", "--config.data.name=synthetic",
         "--config.data.synthetic_docs=200", "--config.data.eval_sequences=8"]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  result = analyze_run(str(tmp_path), num_sequences=8, options=FAST)
  assert result.summary["closedness_max_abs_diff"] == 0.0
  assert (tmp_path / "analysis" / "summary.json").exists()


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
