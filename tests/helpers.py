"""Helpers several test modules share (test modules never import one another)."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.special

from abspos_jax import sweep as sweep_lib
from abspos_jax.analysis import AnalysisOptions
from abspos_jax.data import BOS_ID, builders
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import train
from conftest import SESSION_CACHE, SMALL, small_config, small_flags, xla_flags


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# train.py for the kill and resume tests: SMALL twice as wide and long, so that a step and a checkpoint write last
# long enough for a kill to land inside them; evaluation off; steps and checkpoints as each test asks.
RUN = {"model.d_model": 64, "data.seq_len": 32, "train.warmup_steps": 2, "train.eval_every": 1000,
       "train.steps": None, "checkpoint.every": None}


def command(workdir, *extra):
  return [sys.executable, "train.py", "--config=configs/rope.py", f"--workdir={workdir}", *small_flags(*extra, **RUN)]


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


def sweep_cfg(vary, overrides=None, **fields) -> ml_collections.ConfigDict:
  c = sweep_lib.sweep_defaults()
  c.overrides = ml_collections.ConfigDict(SMALL if overrides is None else overrides)
  c.vary = vary
  for key, value in fields.items():
    *path, leaf = key.split(".")
    node = c
    for p in path:
      node = node[p]
    node[leaf] = value
  return c


def two_seed_sweep(path, **train):
  """A sweep file over seeds 0 and 1 of SMALL (with ``train`` overrides), analysed on 4 sequences."""
  overrides = dict(SMALL, train={**SMALL["train"], "peak_flops": 1e12, **train})  # no matmul peak measurement
  path.write_text(
      "import ml_collections\nfrom abspos_jax.sweep import sweep_defaults\n\n\ndef get_config():\n"
      "  c = sweep_defaults()\n"
      f"  c.overrides = ml_collections.ConfigDict({overrides!r})\n"
      "  c.vary = (('train.seed', (0, 1)),)\n"
      "  c.analyze.num_sequences = 4\n  c.analyze.skip_interventions = True\n  return c\n")
  return path


# --- multi-process runs on loopback (2 processes x 4 CPU devices = one 8-device mesh)

MESH_RUN = ["--config=configs/rope.py", *small_flags("--config.mesh.shape=(2,2,2)",
                                                  "--config.mesh.axes=('data','fsdp','tensor')",
                                                  **{"train.emergence": True})]


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


def seed_compile_cache(dest) -> None:
  """Hard links in ``dest`` to every program the test run has compiled so far: a sweep's own compilation cache
  starts as warm as a user's does after their first run, instead of compiling everything again."""
  shutil.copytree(SESSION_CACHE, dest, copy_function=os.link, dirs_exist_ok=True)


# --- runs several test modules read

EMERGENCE_SEQUENCES = 8


def hooked_config(**overrides):
  """SMALL with the emergence hook at steps 2 and 4 (on 8 sequences) and a checkpoint every step, of which the
  latest and every even step are kept."""
  return small_config(**{"train.emergence": True, "train.emergence_sequences": EMERGENCE_SEQUENCES,
                         "checkpoint.every": 1, "checkpoint.keep": 1, "checkpoint.keep_period": 2, **overrides})


def hooked_run() -> Path:
  """hooked_config() trained once per test session (test_api, test_emergence); tests write only into a copy."""
  return Path(shared_run("hooked", lambda d: train(hooked_config(), d)))


def multihost_reference() -> str:
  """A 1-process run on a (2, 2, 2) mesh of 8 devices: test_storage's run across 1 and 2 processes matches it,
  test_api analyses it on one device."""
  return shared_run("multihost-reference", lambda d: one_process("train.py", f"--workdir={d}", *MESH_RUN))


# --- estimator cases: visibility masks, masked logits and least-squares references

K = 4  # sequence blocks in these tests (halves: even / odd blocks)


def mask(t: int, window: int | None = None) -> np.ndarray:
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  vis = j <= i
  return vis if window is None else vis & (j > i - window)


def softmax_inputs(s: np.ndarray, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Logits ``[B, L, H, T, T]`` with -inf off the mask, and their ``log_z``."""
  vis = visible if visible.ndim == 2 else visible[:, None]
  s = np.where(vis, s, -np.inf).astype(np.float32)
  return s, scipy.special.logsumexp(s, axis=-1).astype(np.float32)


def dummy_design(vis: np.ndarray, n: int, two_way: bool) -> np.ndarray:
  """Per-observation dummy design: n copies of every visible cell (row-major)."""
  t = vis.shape[0]
  rows = []
  for i, j in zip(*np.nonzero(vis)):
    r = np.zeros(2 * t if two_way else t)
    r[i - j] = 1.0
    if two_way:
      r[t + i] = 1.0
    rows.append(r)
  return np.tile(np.array(rows), (n, 1))


def lstsq_fit(vis, x_obs, two_way):
  """OLS on pooled observations ``x_obs [N, T, T]``: fitted cell values and coefficients."""
  d = dummy_design(vis, x_obs.shape[0], two_way)
  y = np.concatenate([x[vis] for x in x_obs]).astype(np.float64)
  coef = np.linalg.lstsq(d, y, rcond=None)[0]
  n_cells = int(vis.sum())
  fitted = np.zeros(vis.shape)
  fitted[vis] = (d[:n_cells] @ coef)
  return fitted, coef


def np_phi(vis, beta):
  qc = vis.sum(1)
  return beta - (qc * beta).sum() / qc.sum()


def sums(vis, x):
  """Per-offset and per-query sums of ``x [N, T, T]`` over the cells, and the sum of squares."""
  t = vis.shape[0]
  i, j = np.nonzero(vis)
  os_ = np.zeros(t)
  np.add.at(os_, i - j, x[:, i, j].sum(0))
  return os_, np.where(vis, x, 0).sum((0, 2)), (np.where(vis, x, 0) ** 2).sum()


VIS_LG = np.stack([mask(8, 3), mask(8)])  # one local, one global layer


# --- analyses of constructed models

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


def summary_numbers(summary: dict) -> np.ndarray:
  """Every number of a summary.json but its meta and memory (the budget is half the memory free at the start:
  machine state, not a result), flattened in key order (None as NaN)."""
  def leaves(x):
    if isinstance(x, dict):
      for k in sorted(x):
        if k not in ("meta", "memory"):
          yield from leaves(x[k])
    elif isinstance(x, list):
      for v in x:
        yield from leaves(v)
    elif x is None:
      yield np.nan
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
      yield x
  return np.array(list(leaves(summary)), float)
