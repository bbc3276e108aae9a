"""The training-time emergence hook against analyze.py, its switch, checkpoints kept along the way, the figures."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from abspos_jax import checkpoint, data, sharding
from abspos_jax.analysis import AnalysisOptions, analyze, analyze_all_steps, analyze_run, api
from abspos_jax.analysis.emergence import EmergenceHook, metric_names
from abspos_jax.analysis.outputs.compare import compare
from abspos_jax.analysis.outputs.curves import run_curves
from abspos_jax.config import ConfigError, validate
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import train
from conftest import small_config
from helpers import EMERGENCE_SEQUENCES, hooked_config, hooked_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = EMERGENCE_SEQUENCES
NO_INTERVENTIONS = AnalysisOptions(interventions=False, progress=False)


@pytest.fixture
def run_dir():
  """helpers.hooked_run(): 4 steps, the hook at steps 2 and 4, checkpoints kept at steps 2 and 4 (read only)."""
  return hooked_run()


def _rel(a, b):
  return abs(a - b) / max(abs(b), 1e-6)


def test_hook_equals_analyze(run_dir, tmp_path):
  """The step-4 record of the hook and analyze.py on the step-4 checkpoint, same sequences, agree to 1e-5."""
  rec = read_metrics(run_dir)[-1]
  assert rec["step"] == 4 and set(metric_names(2)) <= set(rec)
  s = analyze_run(str(run_dir), out=str(tmp_path), num_sequences=N, options=NO_INTERVENTIONS).summary
  pairs = [(rec[f"sink_rate_l{l}"], s["sink_rate"][l]) for l in range(2)]
  pairs += [(rec[f"pos0_norm_ratio_l{l}"], s["position0"]["norm_ratio"][l]) for l in range(3)]
  pairs += [(rec["sink_score_max"], s["sink_score_max"]),
            (rec["leakage_log_weights"], s["leakage"]["log_weights_overall"]),
            (rec["causal_mask_share"], s["components"]["pooled"]["causal_mask"]),
            (rec["residual_stream_share"], s["components"]["pooled"]["residual_stream"]),
            (rec["causal_mask_share_early"], s["components"]["pooled_early"]["causal_mask"]),
            (rec["residual_stream_share_early"], s["components"]["pooled_early"]["residual_stream"])]
  for i, (hook, analysis) in enumerate(pairs):
    assert _rel(hook, analysis) < 1e-5, (i, hook, analysis)
  # The statistics move between evaluations: the record is not a constant.
  first = read_metrics(run_dir)[1]
  assert first["step"] == 2 and first["pos0_norm_ratio_l2"] != rec["pos0_norm_ratio_l2"]
  assert 0 < rec["emergence_fraction"] < 1 and rec["emergence_seconds"] > 0


def test_hook_sink_rates_per_layer_match(run_dir):
  """With the threshold at the median head score, sink rates differ by layer; the hook's follow analyze's scores.

  Heads are chosen on the even blocks (``sink_score_select``) and scored on the odd ones (``sink_score``):
  ``sink_score_max`` is the held-out score of the head with the largest selection score.
  """
  config_, model, _ = checkpoint.load_model(str(run_dir))
  seqs = data.eval_sequences(config_.data, num_sequences=N)[:, :-1]
  stats = analyze(model, {"prepend": seqs}, options=NO_INTERVENTIONS).stats
  select, score = stats["sink_score_select"], stats["sink_score"]  # [L, H] each
  eps = float(np.median(select))
  expected = (select > eps).mean(-1)
  assert 0 < expected.mean() < 1
  graphdef, params = nnx.split(model, nnx.Param)
  mesh = sharding.make_mesh(config_, jax.local_devices()[:1])
  got = EmergenceHook(config_, graphdef, params, mesh, AnalysisOptions(sink_epsilon=eps))(params)[0]
  np.testing.assert_array_equal([got[f"sink_rate_l{l}"] for l in range(2)], expected)
  assert _rel(got["sink_score_max"], score.flat[np.argmax(select)]) < 1e-5


def test_hook_on_stacked_seeds_equals_one_hook_per_run(run_dir):
  """``train_seeds`` stacks K runs' params on a seed axis: one vmapped hook gives each run's own metrics."""
  models = [checkpoint.load_model(str(run_dir), step) for step in (2, 4)]
  config_ = models[0][0]
  mesh = sharding.make_mesh(config_, jax.local_devices()[:1])
  graphdef, _ = nnx.split(models[0][1], nnx.Param)
  params = [nnx.split(m, nnx.Param)[1] for _, m, _ in models]
  stacked = jax.tree.map(lambda *x: np.stack(x), *params)
  together = EmergenceHook(config_, graphdef, stacked, mesh, num_runs=2)(stacked)
  assert len(together) == 2
  for run_params, got in zip(params, together):
    alone = EmergenceHook(config_, graphdef, run_params, mesh)(run_params)[0]
    keys = metric_names(2)  # vmapped reductions may sum in another order: float32 rounding, no more
    np.testing.assert_allclose([got[k] for k in keys], [alone[k] for k in keys], rtol=1e-4, atol=1e-8)
  assert together[0]["pos0_norm_ratio_l2"] != together[1]["pos0_norm_ratio_l2"]


def test_hook_off_leaves_training_bit_identical(run_dir, tmp_path):
  off = train(hooked_config(**{"train.emergence": False}), str(tmp_path))
  on_records, off_records = read_metrics(run_dir), read_metrics(tmp_path)
  assert [r["loss"] for r in on_records] == [r["loss"] for r in off_records]
  assert [r.get("val_loss") for r in on_records] == [r.get("val_loss") for r in off_records]
  assert "sink_score_max" not in off and not any("emergence_seconds" in r for r in off_records)


def test_keep_period_keeps_multiples_beyond_the_latest(run_dir):
  assert sorted(int(s) for s in os.listdir(run_dir / "checkpoints")) == [2, 4]
  with pytest.raises(ConfigError, match=r"checkpoint\.keep_period must be 0 \(off\) or a positive multiple of "
                                        r"checkpoint\.every=2"):
    validate(small_config(**{"checkpoint.keep_period": 3}))
  with pytest.raises(ConfigError, match=r"train\.emergence_sequences must be >= 2"):
    validate(small_config(**{"train.emergence_sequences": 1}))


@pytest.mark.slow
def test_all_steps_and_emergence_curves(run_dir, tmp_path, monkeypatch):
  run_dir = shutil.copytree(run_dir, tmp_path / "run")  # the analyses go into the run directory
  r = subprocess.run([sys.executable, "analyze.py", f"--workdir={run_dir}", "--all_steps", "--num_sequences=4",
                      "--skip_interventions"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  out = run_dir / "analysis_steps"
  assert {"step_2", "step_4", "steps.json", "steps.png"} <= set(os.listdir(out))
  steps = json.loads((out / "steps.json").read_text())["steps"]
  assert [s["step"] for s in steps] == [2, 4] and [s["tokens"] for s in steps] == [2 * 8 * 16, 4 * 8 * 16]
  for s in steps:
    summary = json.loads((out / f"step_{s['step']}" / "summary.json").read_text())
    assert summary["meta"]["step"] == s["step"] and summary["num_sequences"] == 4
    assert s["residual_stream_share_early"] == summary["components"]["pooled_early"]["residual_stream"]
    assert s["sink_score_max"] == summary["sink_score_max"] and "bos_replace" not in s
  latest = json.loads((run_dir / "analysis" / "summary.json").read_text())
  assert latest["meta"]["step"] == 4 and latest["num_sequences"] == 4
  # A rerun with the same settings reads the analyses back instead of recomputing them.
  monkeypatch.setattr(api, "analyze_run", lambda *a, **k: pytest.fail("step analysed again"))
  assert analyze_all_steps(str(run_dir), num_sequences=4, options=NO_INTERVENTIONS) == steps

  curves = run_curves(str(run_dir))
  records = [m for m in read_metrics(run_dir) if "sink_score_max" in m]
  assert curves["step"] == [2, 4] and curves["tokens"] == [m["tokens"] for m in records]
  assert curves["sink_rate_max"] == [max(m["sink_rate_l0"], m["sink_rate_l1"]) for m in records]
  assert curves["pos0_norm_ratio_last"] == [m["pos0_norm_ratio_l2"] for m in records]
  table = compare([str(run_dir), str(run_dir / "analysis_steps" / "step_2")], str(tmp_path / "cmp"))
  assert os.path.exists(tmp_path / "cmp" / "emergence.png")
  stored = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
  assert [list(row["emergence"]) for row in stored.values()] == [list(row["emergence"]) for row in table.values()]
  assert sum(len(row["emergence"]) for row in stored.values()) == 1  # the analysis directory has no metrics
  assert "![emergence](emergence.png)" in (tmp_path / "cmp" / "comparison.md").read_text()
