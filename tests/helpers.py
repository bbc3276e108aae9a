"""Helpers several test modules share (test modules never import one another)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import ml_collections
import numpy as np

from abspos_jax import sweep as sweep_lib
from abspos_jax.data import builders
from abspos_jax.metrics import read_metrics
from conftest import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["--config.model.num_layers=2", "--config.model.d_model=64", "--config.model.num_heads=4",
       "--config.data.seq_len=32", "--config.train.batch_size=8", "--config.train.warmup_steps=2",
       "--config.train.log_every=1", "--config.train.eval_every=1000", "--config.train.progress=False",
       "--config.data.eval_sequences=8", "--config.data.name=synthetic", "--config.data.synthetic_docs=200"]


def command(workdir, *extra):
  return [sys.executable, "train.py", "--config=configs/rope.py", f"--workdir={workdir}", *RUN, *extra]


def losses(workdir):
  return {m["step"]: m["loss"] for m in read_metrics(workdir)}


def wait_for(predicate, proc, timeout=120.0):
  """Poll until ``predicate()``; False if the process ended first."""
  end = time.time() + timeout
  while time.time() < end:
    if predicate():
      return True
    if proc.poll() is not None:
      return False
    time.sleep(0.002)
  raise TimeoutError("condition not reached")


TINY = {
    "model": {"num_layers": 2, "d_model": 32, "num_heads": 4, "window": 4},
    "data": {"seq_len": 16, "name": "synthetic", "synthetic_docs": 200, "eval_sequences": 8},
    "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "log_every": 2, "eval_every": 2, "progress": False},
    "checkpoint": {"every": 2},
}


def sweep_cfg(vary, overrides=None, **fields) -> ml_collections.ConfigDict:
  c = sweep_lib.sweep_defaults()
  c.overrides = ml_collections.ConfigDict(TINY if overrides is None else overrides)
  c.vary = vary
  for key, value in fields.items():
    *path, leaf = key.split(".")
    node = c
    for p in path:
      node = node[p]
    node[leaf] = value
  return c


def two_seed_sweep(path, **train):
  """A sweep file over seeds 0 and 1 of TINY (with ``train`` overrides), analysed on 4 sequences."""
  overrides = dict(TINY, train={**TINY["train"], "peak_flops": 1e12, **train})  # no matmul peak measurement
  path.write_text(
      "import ml_collections\nfrom abspos_jax.sweep import sweep_defaults\n\n\ndef get_config():\n"
      "  c = sweep_defaults()\n"
      f"  c.overrides = ml_collections.ConfigDict({overrides!r})\n"
      "  c.vary = (('train.seed', (0, 1)),)\n"
      "  c.analyze.num_sequences = 4\n  c.analyze.skip_interventions = True\n  return c\n")
  return path


# --- multi-process runs on loopback (2 processes x 4 CPU devices = one 8-device mesh)

MESH_RUN = ["--config=configs/rope.py", "--config.model.num_layers=2", "--config.model.d_model=32",
       "--config.data.seq_len=16", "--config.train.batch_size=8", "--config.train.steps=4",
       "--config.train.warmup_steps=1", "--config.train.log_every=1", "--config.train.eval_every=2",
       "--config.train.progress=False", "--config.data.name=synthetic", "--config.data.synthetic_docs=200",
       "--config.data.eval_sequences=8", "--config.checkpoint.every=2", "--config.mesh.shape=(2,2,2)",
       "--config.mesh.axes=('data','fsdp','tensor')"]


def one_process(*args, timeout=300):
  env = {**os.environ, "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=8")}
  r = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, r.stderr[-3000:]
  return r


def two_processes(*args, timeout=300):
  r = subprocess.run([sys.executable, "-m", "abspos_jax.launch", "--num_processes=2", "--devices_per_process=4",
                      "--", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  return r


# Emergence metrics (the hook runs at each evaluation with params sharded over both processes).
HOOK = ("sink_score_max", "pos0_norm_ratio_l2", "leakage_log_weights", "residual_stream_share")


def records(workdir):
  return {m["step"]: (m["loss"], m.get("val_loss"), *(m.get(k) for k in HOOK)) for m in read_metrics(workdir)}


def assert_same(a, b):
  assert sorted(a) == sorted(b) == [1, 2, 3, 4]
  for step in a:
    np.testing.assert_allclose(a[step][0], b[step][0], rtol=1e-5)
    for x, y in zip(a[step][1:], b[step][1:]):
      assert (x is None) == (y is None)
      if x is not None:
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert all(a[step][2] is not None for step in (2, 4))  # the hook ran at both evaluations


def shared_run(name: str, build) -> str:
  """A run directory built once per test session, whatever the number of xdist workers: the first caller runs
  ``build(dir)`` under a file lock, later callers (any worker) reuse it. Tests must only read it."""
  root = os.environ["ABSPOS_TEST_SHARED"]
  d = os.path.join(root, name)
  with builders.file_lock(Path(root) / f"{name}.lock"):
    if not os.path.exists(os.path.join(d, ".complete")):
      build(d)
      open(os.path.join(d, ".complete"), "w").close()
  return d


def multihost_reference() -> str:
  """The one-process, 8-device run that the 2-process runs of test_multihost and test_object_storage match."""
  return shared_run("multihost-reference", lambda d: one_process("train.py", f"--workdir={d}", *MESH_RUN))
