"""Multi-process runs on loopback: 2 JAX processes x 4 CPU devices form one 8-device mesh.

Checked against 1 process x 8 devices: losses and a checkpoint crossing from 1
process to 2, and one process dying. test_storage runs 2 processes into a
bucket: the crossing from 2 processes to 1, and the analysis under 2 processes.
"""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from abspos_jax.metrics import read_metrics
from helpers import ROOT, MESH_RUN as RUN, assert_same, multihost_reference, one_process, records, two_processes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
  return multihost_reference()


def test_two_processes_resume_a_one_process_checkpoint_and_match_one_process(reference, tmp_path):
  """1 process for steps 1-2, then 2 processes resume its checkpoint for steps 3-4 (the step-4 evaluation with
  the emergence hook included): every record matches the 1-process reference. The other direction (2 processes,
  then 1) and the analysis under 2 processes are checked in a bucket (test_storage)."""
  one_process("train.py", f"--workdir={tmp_path}", *RUN, "--config.train.stop_at_step=2")
  r = two_processes("train.py", f"--workdir={tmp_path}", *RUN)
  assert "[p0] resumed from step 2" in r.stdout and "[p1] resumed from step 2" in r.stdout
  assert_same(records(tmp_path), records(reference))


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
