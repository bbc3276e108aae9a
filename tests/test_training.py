"""End-to-end training: sharded == single device, resume == uninterrupted, workdir checks."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from abspos_jax.config import ConfigError
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import train
from conftest import small_config, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.model.num_layers=2", "--config.model.d_model=32", "--config.model.num_heads=4",
         "--config.data.seq_len=16", "--config.train.batch_size=8", "--config.train.steps=4",
         "--config.train.warmup_steps=1", "--config.train.log_every=1", "--config.train.eval_every=2",
         "--config.train.progress=False", "--config.data.eval_sequences=8", "--config.checkpoint.every=2",
         "--config.data.name=synthetic", "--config.data.synthetic_docs=200"]


def run_train(workdir, *extra, devices=1):
  env = dict(os.environ)
  env["XLA_FLAGS"] = xla_flags(f"--xla_force_host_platform_device_count={devices}")
  r = subprocess.run([sys.executable, "train.py", "--config=configs/rope.py", f"--workdir={workdir}", *SMALL,
                      *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return [m["loss"] for m in read_metrics(workdir)]


def config(**overrides):
  return small_config(**{"data.name": "synthetic", "data.synthetic_docs": 200, **overrides})


@pytest.mark.slow
def test_sharded_equals_single_device(tmp_path):
  single = run_train(tmp_path / "one", devices=1)
  data8 = run_train(tmp_path / "data8", "--config.mesh.shape=(8,)", devices=8)
  mixed = run_train(tmp_path / "mixed", "--config.mesh.shape=(2,2,2)", "--config.mesh.axes=('data','fsdp','tensor')",
                    devices=8)
  assert len(single) == 4
  np.testing.assert_allclose(data8, single, rtol=1e-5)
  np.testing.assert_allclose(mixed, single, rtol=1e-5)


def test_resume_equals_uninterrupted(tmp_path):
  whole = train(config(), str(tmp_path / "whole"))
  train(config(**{"train.stop_at_step": 2}), str(tmp_path / "split"))
  assert [m["step"] for m in read_metrics(tmp_path / "split")] == [1, 2]
  resumed = train(config(), str(tmp_path / "split"))
  a, b = read_metrics(tmp_path / "whole"), read_metrics(tmp_path / "split")
  assert [m["step"] for m in b] == [1, 2, 3, 4]
  assert [m["loss"] for m in a] == [m["loss"] for m in b]
  assert whole["val_loss"] == resumed["val_loss"]


def test_workdir_outputs(tmp_path):
  train(config(), str(tmp_path))
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
  train(config(**{"train.steps": 6, "train.log_every": 2, "train.eval_every": 3, "train.emergence": False}),
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
  train(config(), str(tmp_path))
  with pytest.raises(ConfigError, match=r"model\.num_layers: stored 2, now 3"):
    train(config(**{"model.num_layers": 3}), str(tmp_path))


def test_grad_accumulation_matches_one_big_batch(tmp_path):
  a = train(config(), str(tmp_path / "a"))
  b = train(config(**{"train.grad_accum": 2}), str(tmp_path / "b"))
  la, lb = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
  np.testing.assert_allclose([m["loss"] for m in la], [m["loss"] for m in lb], rtol=1e-5)
  np.testing.assert_allclose(a["val_loss"], b["val_loss"], rtol=1e-5)


@pytest.mark.slow
def test_demo_learns(tmp_path):
  """A shorter `make demo`: 100 steps of configs/tiny.py on stdlib text go well below the byte unigram entropy.

  The README quotes the full demo (400 steps): validation loss about 1.48 nats/byte.
  """
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                      "--config.train.steps=100", "--config.train.eval_every=100", "--config.train.progress=False"],
                     cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  records = read_metrics(tmp_path)
  assert records[0]["loss"] > 3.0  # starts near log(259) = 5.56, falls fast
  assert records[-1]["val_loss"] < 2.4  # byte unigram entropy of Python source is about 3 nats


def test_known_peak_matches_device_kind_prefixes():
  from abspos_jax.flops import KNOWN_PEAKS, known_peak
  assert known_peak("NVIDIA H200") == KNOWN_PEAKS["NVIDIA H200"] == 989e12
  assert known_peak("TPU v5 lite") == 197e12
  assert known_peak("cpu") == 0.0
