"""Helpers several test modules share (test modules never import one another)."""

import os
import sys
import time

import ml_collections

from abspos_jax import sweep as sweep_lib
from abspos_jax.metrics import read_metrics

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
