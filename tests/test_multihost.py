"""Multi-process runs on loopback: 2 JAX processes x 4 CPU devices form one 8-device mesh.

Checked against 1 process x 8 devices: losses, checkpoints across process
counts (both ways), analysis numbers, and one process dying.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from abspos_jax.analysis import AnalysisOptions, analyze_run
from abspos_jax.metrics import read_metrics
from helpers import ROOT, MESH_RUN as RUN, assert_same, multihost_reference, one_process, records, two_processes

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference():
  return multihost_reference()


def test_two_processes_match_one_and_checkpoints_cross_over(reference, tmp_path):
  """Every step and both evaluations (with the emergence hook) run once under 2 processes, each run crossing
  over to the other process count at its checkpoint, and match the 1-process reference."""
  # 2 processes for steps 1-2, then 1 process resumes their checkpoint for steps 3-4 ...
  two_processes("train.py", f"--workdir={tmp_path / 'a'}", *RUN, "--config.train.stop_at_step=2")
  r = one_process("train.py", f"--workdir={tmp_path / 'a'}", *RUN)
  assert "resumed from step 2" in r.stderr
  assert_same(records(tmp_path / "a"), records(reference))
  # ... and the reverse: 1 process for steps 1-2, 2 processes for steps 3-4.
  one_process("train.py", f"--workdir={tmp_path / 'b'}", *RUN, "--config.train.stop_at_step=2")
  r = two_processes("train.py", f"--workdir={tmp_path / 'b'}", *RUN)
  assert "[p0] resumed from step 2" in r.stdout and "[p1] resumed from step 2" in r.stdout
  assert_same(records(tmp_path / "b"), records(reference))


def numbers(path):
  s = json.loads(path.read_text())
  s.pop("meta")
  s.pop("memory")  # the budget is half the memory free at the start: machine state, not a result
  return s


def test_analysis_under_two_processes_matches_one(reference, tmp_path):
  """analyze.py under 2 processes against analyze_run in this (one) process: the analysis restores the
  parameters onto one device either way. Interventions are skipped to bound the time: they reuse the same
  restore, data and write paths."""
  analyze_run(reference, out=str(tmp_path / "one"), num_sequences=8,
              options=AnalysisOptions(batch_size=4, interventions=False, progress=False))
  r = two_processes("analyze.py", f"--workdir={reference}", "--num_sequences=8", "--batch_size=4",
                    "--skip_interventions", f"--out={tmp_path / 'two'}")
  assert "[p0] wrote" in r.stdout and "[p1] wrote" not in r.stdout  # a real 2-process run; process 0 writes
  a, b = numbers(tmp_path / "one" / "summary.json"), numbers(tmp_path / "two" / "summary.json")
  flat = lambda x: np.array([v for v in _leaves(x)], float)
  np.testing.assert_allclose(flat(a), flat(b), rtol=1e-5, atol=1e-6)


def _leaves(x):
  if isinstance(x, dict):
    for k in sorted(x):
      yield from _leaves(x[k])
  elif isinstance(x, list):
    for v in x:
      yield from _leaves(v)
  elif isinstance(x, (int, float)) and not isinstance(x, bool):
    yield x
  elif x is None:
    yield np.nan


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
