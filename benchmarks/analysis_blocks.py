"""The analysis step's speed against its query block: steady tokens/s of the baseline step per (T, block, batch).

    python -m benchmarks.analysis_blocks --configs=1024:1024:4,1024:256:4 [--shape=12x768x12] [--num_sequences=8]
                                         [--key_bands=4] [--window=W]

Each config is ``seq_len:query_block:batch``. For each, in this process: the
random RoPE decoder of ``--shape`` (seeded), ``steps.make_baseline_step`` at
that block (``query_block = seq_len``: all queries at once), compiled (the
compile time and XLA's step bytes are reported), warmed up on one batch, then
timed over ``--num_sequences`` sequences in batches of ``batch``, all past the
closedness check's sequences (the steady state). "first batch / steady" is
one batch on empty accumulators (the step then also profiles the first
sequence's references, ``leakage.LayerFold.begin``) against a steady batch. ``--key_bands`` sets
``attention.KEY_BANDS`` (1: every block scores all ``T`` keys), to separate
the gain of smaller blocks from that of the bands. ``--window=W``: an ``swa``
model with a window of ``W`` keys in every layer, each config timed twice,
with its blocks scoring the keys of their window only
(``attention.window_span``) and, as the reference, from key 0 (the bands).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import attention
from abspos_jax import model as model_lib
from abspos_jax.analysis.core import layer_visible
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.passes import memory, steps
from benchmarks import common
from benchmarks.train_throughput import size_config


def measure(shape: str, seq_len: int, block: int, batch: int, num_sequences: int, window: int = 0) -> list:
  """``[seq_len, block, batch, compile s, step GiB, tok/s]`` of one config (``window``: an swa model)."""
  layers, d_model, heads = (int(x) for x in shape.split("x"))
  c = size_config(layers, d_model, heads, seq_len, 1)
  if window:
    c.model.position, c.model.window = "swa", window
  m = model_lib.create(c, seed=0)
  graphdef, params = nnx.split(m, nnx.Param)
  design = fixed_effects.make_design(layer_visible(m.spec, seq_len))
  acc = steps.init_accumulators(m.spec, seq_len, {}, AnalysisOptions().num_blocks)
  step = jax.jit(steps.make_baseline_step(graphdef, design, {}, query_block=None if block == seq_len else block),
                 donate_argnums=1)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (num_sequences, seq_len)), jnp.int32)
  t0 = time.perf_counter()
  compiled = step.lower(params, acc, jax.ShapeDtypeStruct((batch, seq_len), jnp.int32),
                        jax.ShapeDtypeStruct((batch,), jnp.int32)).compile()
  compile_s = time.perf_counter() - t0
  first = AnalysisOptions().closedness_sequences  # batches from here on skip the closedness check
  def first_batch():  # empty accumulators: the step also profiles the first sequence's references
    return compiled(params, jax.tree.map(jnp.copy, acc), tokens[:batch], jnp.arange(first, first + batch))

  jax.block_until_ready(first_batch())
  t0 = time.perf_counter()
  a = jax.block_until_ready(first_batch())
  first_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for start in range(0, num_sequences - batch + 1, batch):
    a = compiled(params, a, tokens[start:start + batch], jnp.arange(first + start, first + start + batch))
  jax.block_until_ready(a)
  steps_done = num_sequences // batch
  steady_s = time.perf_counter() - t0
  return [seq_len, block, batch, f"{compile_s:.1f}", f"{memory.step_bytes(compiled) / memory.GiB:.2f}",
          round(steps_done * batch * seq_len / steady_s), f"{first_s / (steady_s / steps_done):.2f}"]


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--configs", default="1024:1024:4,1024:256:4")
  p.add_argument("--shape", default="12x768x12", help="layers x d_model x heads")
  p.add_argument("--num_sequences", type=int, default=8)
  p.add_argument("--key_bands", type=int, default=attention.KEY_BANDS)
  p.add_argument("--window", type=int, default=0, help="> 0: an swa model with this window, with and without "
                                                           "window_span")
  a = p.parse_args()
  attention.KEY_BANDS = a.key_bands
  rows = []
  span = attention.window_span
  for config in a.configs.split(","):
    for keys in (("window", "from key 0") if a.window else ("",)):
      attention.window_span = span if keys != "from key 0" else (lambda *args: None)
      rows.append(measure(a.shape, *(int(x) for x in config.split(":")), a.num_sequences, a.window) + [keys])
      print(rows[-1], flush=True)
  print(f"machine: {common.machine()}; shape {a.shape}, key bands {a.key_bands}, window {a.window or 'none'}")
  print(common.markdown_table(["seq_len", "query block", "batch", "compile s", "step GiB", "steady tok/s",
                               "first batch / steady", "keys per block"], rows))


if __name__ == "__main__":
  main()
