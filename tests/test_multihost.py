"""Multi-process runs on loopback: 2 JAX processes x 4 CPU devices form one 8-device mesh. Here: one process
dying stops the others, and the checkpoints left are whole. test_storage runs a run across 1 and 2 processes
(both crossings, every record against 1 process x 8 devices) and the analysis under 2 processes, in a bucket."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from abspos_jax.metrics import read_metrics
from helpers import ROOT, MESH_RUN as RUN

pytestmark = pytest.mark.slow


def test_one_process_dying_stops_the_others(tmp_path):
  launcher = subprocess.Popen(
      [sys.executable, "-m", "abspos_jax.launch", "--num_processes=2", "--devices_per_process=4", "--grace_s=5", "--",
       "train.py", f"--workdir={tmp_path}", *RUN, "--config.train.steps=100000", "--config.checkpoint.every=5"],
      cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # an unread stdout pipe would fill
  deadline = time.time() + 240
  while not ((tmp_path / "metrics.jsonl").exists() and len(read_metrics(tmp_path)) >= 12):
    assert time.time() < deadline and launcher.poll() is None
    time.sleep(0.2)
  victim = next(c for c in psutil.Process(launcher.pid).children() if c.environ().get("JAX_PROCESS_ID") == "1")
  victim.send_signal(signal.SIGKILL)
  t0 = time.time()
  _, err = launcher.communicate(timeout=120)
  assert time.time() - t0 < 60
  assert launcher.returncode != 0
  assert "process 1 exited with status -9; stopping the others" in err
  from abspos_jax import checkpoint
  mgr = checkpoint.manager(str(tmp_path), read_only=True)
  steps = mgr.all_steps()
  assert steps and all(os.path.exists(tmp_path / "checkpoints" / str(s) / "meta") for s in steps)
