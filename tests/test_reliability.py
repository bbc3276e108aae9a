"""Reliability: killed runs resume identically, graceful stops, NaNs, damaged files, full disks, bad flags."""

import os
import random
import signal
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import checkpoint, data, train_step
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import NonFiniteError, train
from conftest import small_config
from helpers import ROOT, command, losses, wait_for


def checkpoint_tmp_dir(workdir):
  d = os.path.join(workdir, "checkpoints")
  return os.path.isdir(d) and any(not name.isdigit() for name in os.listdir(d))


@pytest.mark.slow
def test_kill_anywhere_resumes_identically(tmp_path):
  """SIGKILL at random moments (after k logged steps, mid-checkpoint-write, at random times); rerun to the end."""
  steps = ["--config.train.steps=40", "--config.checkpoint.every=4", "--config.checkpoint.keep=2"]
  ref = tmp_path / "ref"
  subprocess.run(command(ref, *steps), cwd=ROOT, check=True, capture_output=True, timeout=300)
  work = tmp_path / "killed"
  rng = random.Random(0)
  kinds = ["after_steps", "during_checkpoint_write", "random_time", "after_steps", "during_checkpoint_write"]
  tried = []
  for kind in kinds:
    proc = subprocess.Popen(command(work, *steps), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kind == "after_steps":
      target = len(read_metrics(work)) + rng.randint(1, 8) if (work / "metrics.jsonl").exists() else rng.randint(1, 8)
      hit = wait_for(lambda: (work / "metrics.jsonl").exists() and len(read_metrics(work)) >= target, proc)
    elif kind == "during_checkpoint_write":
      hit = wait_for(lambda: checkpoint_tmp_dir(work), proc)
    else:
      time.sleep(rng.uniform(0.5, 6.0))
      hit = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    tried.append((kind, hit))
  assert sum(hit for _, hit in tried) >= 4, tried  # most kills landed while training ran
  subprocess.run(command(work, *steps), cwd=ROOT, check=True, capture_output=True, timeout=300)
  assert losses(work) == losses(ref)
  assert sorted(losses(work)) == list(range(1, 41))


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
  proc = subprocess.Popen(command(tmp_path, "--config.train.steps=100000", "--config.checkpoint.every=100000"),
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  assert wait_for(lambda: (tmp_path / "metrics.jsonl").exists() and len(read_metrics(tmp_path)) >= 3, proc)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-2000:]
  assert "on SIGTERM, checkpoint saved; rerun the same command to resume" in err
  last = read_metrics(tmp_path)[-1]["step"]
  mgr = checkpoint.manager(str(tmp_path), read_only=True)
  assert mgr.latest_step() == last
  r = subprocess.run(command(tmp_path, "--config.train.steps=100000", "--config.checkpoint.every=100000",
                             f"--config.train.stop_at_step={last + 2}"), cwd=ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0 and f"resumed from step {last}" in r.stderr, r.stderr[-2000:]
  assert [m["step"] for m in read_metrics(tmp_path)] == list(range(1, last + 3))


def poison_batch(monkeypatch, step):
  """Make the loss NaN on the ``step``-th training batch (identified by its tokens)."""
  c = small_config()
  it = data.train_iterator(c.data, batch_size=c.train.batch_size, seed=c.train.seed)
  batch = [next(it)["tokens"] for _ in range(step)][-1]
  target_sum = int(batch[:, 1:].sum())
  clean = train_step.lm_loss
  monkeypatch.setattr(train_step, "lm_loss", lambda logits, targets: clean(logits, targets) * jnp.where(
      targets.sum() == target_sum, jnp.nan, 1.0))


def test_nonfinite_loss_stops_and_keeps_last_checkpoint(tmp_path, monkeypatch):
  poison_batch(monkeypatch, 3)
  with pytest.raises(NonFiniteError, match=r"at step 3: .* the last checkpoint \(step 2\) is untouched"):
    train(small_config(), str(tmp_path))
  mgr = checkpoint.manager(str(tmp_path), read_only=True)
  assert mgr.all_steps() == [2]
  assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]


def test_nonfinite_loss_can_skip_the_batch(tmp_path, monkeypatch):
  clean = train(small_config(), str(tmp_path / "clean"))
  poison_batch(monkeypatch, 3)
  last = train(small_config(**{"train.nonfinite": "skip"}), str(tmp_path / "skip"))
  records = read_metrics(tmp_path / "skip")
  assert np.isnan(records[2]["loss"]) and last["skipped_steps"] == 1 and np.isfinite(last["loss"])
  assert [m["loss"] for m in records[:2]] == [m["loss"] for m in read_metrics(tmp_path / "clean")][:2]
  assert clean["skipped_steps"] == 0


def test_truncated_array_record_shard(tmp_path):
  docs = tmp_path / "docs"
  docs.mkdir()
  for i in range(4):
    (docs / f"{i}.txt").write_text(f"document {i} " * 200)
  c = small_config(**{"data.name": "text_files", "data.files": str(docs / "*.txt"), "data.data_dir": str(tmp_path / "d")})
  data.get_data_sources(c.data)
  shards = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "d") for f in fs if ".array_record" in f]
  assert shards
  for path in shards:
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(ValueError, match=r"cannot be read.*array_record.*delete"):
    data.token_stream(c.data, "train")


def test_unwritable_workdir(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(OSError, match=r"--workdir .*file/run cannot be used"):
    train(small_config(), str(tmp_path / "file" / "run"))


def test_bad_cli_flags_and_types(tmp_path):
  for flag, expected in (("--config.train.steps=abc", "steps"), ("--config.model.tie_embeddings=maybe", "tie_embeddings"),
                         ("--no_such_flag=1", "no_such_flag"), ("--config.train.nonfinite=ignore", "train.nonfinite")):
    r = subprocess.run(command(tmp_path / "w", flag), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and expected in r.stderr, (flag, r.stderr[-1500:])


def test_analysis_crash_keeps_previous_results(tmp_path, monkeypatch):
  from abspos_jax.analysis import AnalysisOptions, analyze_run
  from abspos_jax.analysis.outputs import figures, writer
  train(small_config(), str(tmp_path / "run"))
  out = tmp_path / "run" / "analysis"
  result = analyze_run(str(tmp_path / "run"), num_sequences=8,
                       options=AnalysisOptions(batch_size=4, interventions=False, progress=False))
  before = (out / "summary.json").read_text()
  def crash(*a, **k):
    raise RuntimeError("crash while drawing")
  monkeypatch.setattr(figures, "all_figures", crash)
  with pytest.raises(RuntimeError, match="crash while drawing"):
    writer.write(str(out), {**result.summary, "loss": {"prepend": -1.0}}, result.stats, {"step": 0})
  assert (out / "summary.json").read_text() == before
  assert not [n for n in os.listdir(tmp_path / "run") if n.startswith(".analysis-")]
