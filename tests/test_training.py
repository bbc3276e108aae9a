"""End-to-end training: sharded == single device, resume == uninterrupted, workdir checks."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from abspos_jax.config import ConfigError
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import train
from conftest import default_level_env, small_config


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_resume_equals_uninterrupted(tmp_path):
  whole = train(small_config(), str(tmp_path / "whole"))
  train(small_config(**{"train.stop_at_step": 2}), str(tmp_path / "split"))
  assert [m["step"] for m in read_metrics(tmp_path / "split")] == [1, 2]
  resumed = train(small_config(), str(tmp_path / "split"))
  a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
  assert [m["step"] for m in b] == [1, 2, 3, 4]
  assert [m["loss"] for m in a] == [m["loss"] for m in b]
  assert whole["val_loss"] == resumed["val_loss"]


def test_workdir_outputs(tmp_path):
  train(small_config(), str(tmp_path))
  stored = json.loads((tmp_path / "config.json").read_text())
  assert stored["model"]["position"] == "rope"
  records = read_metrics(tmp_path)
  assert {"step", "loss", "tokens_per_s", "mfu", "tflops_per_device"} <= set(records[0])
  assert "val_loss" in records[1]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
  assert os.listdir(tmp_path / "tensorboard")


def test_evaluation_follows_eval_every_not_log_every(tmp_path):
  """Each periodic action keeps its own schedule: an evaluation step that is not a logging step still evaluates
  (and logs), a logging step that is not an evaluation step does not evaluate, the last step does both."""
  train(small_config(**{"train.steps": 6, "train.log_every": 2, "train.eval_every": 3, "train.emergence": False}),
        str(tmp_path))
  records = read_metrics(tmp_path)
  assert [m["step"] for m in records] == [2, 3, 4, 6]
  assert [m["step"] for m in records if "val_loss" in m] == [3, 6]
  assert all("loss" in m and "tokens_per_s" in m for m in records)


def test_itstime():
  from abspos_jax.train_loop import itstime
  assert [s for s in range(1, 11) if itstime(s, 4, 10)] == [4, 8, 10]
  assert [s for s in range(1, 11) if itstime(s, 0, 10)] == [10]
  assert itstime(3, 4, 10, force=True)


def test_workdir_with_other_config_is_refused(tmp_path):
  train(small_config(), str(tmp_path))
  with pytest.raises(ConfigError, match=r"model\.num_layers: stored 2, now 3"):
    train(small_config(**{"model.num_layers": 3}), str(tmp_path))


def test_grad_accumulation_matches_one_big_batch(tmp_path):
  a = train(small_config(), str(tmp_path / "a"))
  b = train(small_config(**{"train.grad_accum": 2}), str(tmp_path / "b"))
  la, lb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
  np.testing.assert_allclose([m["loss"] for m in la], [m["loss"] for m in lb], rtol=1e-5)
  np.testing.assert_allclose(a["val_loss"], b["val_loss"], rtol=1e-5)


DRIFT_TOL = 0.01  # nats: README rounds to 0.005; CPUs of other kinds move a 100-step float32 loss by ~1e-4


@pytest.mark.slow
def test_demo_numbers_in_readme_still_come_back(tmp_path):
  """`make demo` in miniature: its first 100 steps (the same 400-step schedule, stopped at step 100) give the
  step-20 training loss and step-100 validation loss README states, within DRIFT_TOL. A change to the step, the
  data or the initialisation that moves them fails here instead of silently making the README wrong."""
  readme = open(os.path.join(ROOT, "README.md")).read()
  train_20 = float(re.search(r"training loss goes\s+([\d.]+) \(step 20\)", readme).group(1))
  val_100 = float(re.search(r"validation loss\s+([\d.]+) ->", readme).group(1))
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                      "--config.train.stop_at_step=100", "--config.train.progress=False",
                      "--config.train.emergence=False"], cwd=ROOT, env=default_level_env(), capture_output=True,
                     text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  records = {m["step"]: m for m in read_metrics(tmp_path)}
  assert abs(records[20]["loss"] - train_20) <= DRIFT_TOL, (records[20]["loss"], train_20)
  assert abs(records[100]["val_loss"] - val_100) <= DRIFT_TOL, (records[100]["val_loss"], val_100)


def test_known_peak_matches_device_kind_prefixes():
  from abspos_jax.flops import KNOWN_PEAKS, known_peak
  assert known_peak("NVIDIA H200") == KNOWN_PEAKS["NVIDIA H200"] == 989e12
  assert known_peak("TPU v5 lite") == 197e12
  assert known_peak("cpu") == 0.0
