"""Checkpoints (checkpoint.py): a damaged one is set aside and an older one used, a foreign one is refused by
name, a full disk keeps the complete ones."""

import errno
import json
import os
import shutil
import subprocess

import pytest

from abspos_jax import checkpoint
from abspos_jax.train_loop import train
from conftest import small_config
from helpers import losses


def damage(step_dir):
  """Truncate every array file of a checkpoint's params to half its size."""
  for root, _, files in os.walk(os.path.join(step_dir, "params")):
    for name in files:
      path = os.path.join(root, name)
      size = os.path.getsize(path)
      with open(path, "r+b") as f:
        f.truncate(size // 2)


def test_damaged_checkpoint_falls_back_to_an_older_one(tmp_path):
  train(small_config(**{"train.steps": 6, "train.stop_at_step": 4}), str(tmp_path / "run"))
  damage(tmp_path / "run" / "checkpoints" / "4")
  train(small_config(**{"train.steps": 6}), str(tmp_path / "run"))
  train(small_config(**{"train.steps": 6}), str(tmp_path / "ref"))
  assert losses(tmp_path / "run") == losses(tmp_path / "ref")
  moved = os.listdir(tmp_path / "run" / "corrupt_checkpoints")
  assert len(moved) == 1 and moved[0].startswith("4-")


def test_damaged_or_foreign_checkpoint_is_refused_by_analysis(tmp_path):
  train(small_config(), str(tmp_path / "run"))
  shutil.copytree(tmp_path / "run", tmp_path / "other")
  cfg = json.loads((tmp_path / "other" / "config.json").read_text())
  cfg["model"]["d_model"] = 64
  (tmp_path / "other" / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"checkpoints/4 cannot be restored"):
    checkpoint.load_model(str(tmp_path / "other"))
  damage(tmp_path / "run" / "checkpoints" / "4")
  with pytest.raises(ValueError, match=r"checkpoints/4 cannot be restored"):
    checkpoint.load_model(str(tmp_path / "run"))
  assert checkpoint.load_model(str(tmp_path / "run"), step=2)[2] == 2


@pytest.fixture
def small_disk(tmp_path):
  """A 4 MiB tmpfs, or None where mounting is not allowed."""
  mnt = tmp_path / "disk"
  mnt.mkdir()
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
  if r.returncode != 0:
    yield None
    return
  yield mnt
  subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_keeps_saved_checkpoints(tmp_path, small_disk, monkeypatch):
  c = small_config(**{"train.steps": 60, "checkpoint.every": 1, "checkpoint.keep": 100, "model.d_model": 64})
  if small_disk is None:  # no mount here: the writer reports a full disk after 3 saves
    real, calls = checkpoint.save, []
    def full(*args, **kwargs):
      calls.append(1)
      if len(calls) > 3:
        raise OSError(errno.ENOSPC, "No space left on device")
      return real(*args, **kwargs)
    monkeypatch.setattr(checkpoint, "save", full)
    workdir = tmp_path / "run"
  else:
    workdir = small_disk / "run"
  with pytest.raises(OSError, match=r"no space left on the device .* the complete checkpoints \[\d.*\] are intact"):
    train(c, str(workdir))
  config_, model, step = checkpoint.load_model(str(workdir))
  assert step >= 1 and model.spec.d_model == 64
