"""Where time goes: train-step and analysis-step cost against seq_len and depth, and a breakdown.

    python -m benchmarks.scaling [--seq_lens=128,256,512,1024,2048] [--depths=2,4,8] [--repeats=3]

Model: d_model 128, 4 heads (the tiny width). Seq_len rows use 4 layers and a
batch of ``--tokens`` tokens (``batch = tokens / seq_len``, at least 1), so the
matmul work per step is constant and growth shows the attention's ``T^2``;
depth rows use seq_len 128 and the same token budget. Each row reports
milliseconds per step (median of ``--repeats``) and, for training, the forward
alone, forward+backward and the full step timed separately (their differences
are the backward's and the optimizer's cost), and the forward of the same model
with the attention scores and softmax dropped (projections kept: the output is
``wo(wv(x))``), whose difference to the forward is the attention's cost.
"""

import argparse
import os
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import model as model_lib, optim
from abspos_jax.analysis.passes import steps
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.core import layer_visible
from abspos_jax.attention import Attention
from abspos_jax.train_step import make_loss_fn, make_train_step
from benchmarks import common
from benchmarks.train_throughput import size_config


def best_ms(fn: Callable[[], object], repeats: int) -> float:
  """Median milliseconds of ``fn()`` (blocked) after one warm-up call."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return 1e3 * common.median(times)


def no_scores(self, x, positions, *, hooks=None, name="attn"):
  """The attention's projections without scores or softmax: ``wo(wv(x))`` (for the attention share)."""
  x = x.astype(self.dtype)
  v = jnp.einsum("btd,dhk->bthk", x, self.wv[...].astype(self.dtype))
  q = jnp.einsum("btd,dhk->bthk", x, self.wq[...].astype(self.dtype))
  k = jnp.einsum("btd,dhk->bthk", x, self.wk[...].astype(self.dtype))
  return jnp.einsum("bthk,hkd->btd", v + 0 * (q + k), self.wo[...].astype(self.dtype))


def train_row(layers: int, seq_len: int, batch: int, repeats: int) -> dict:
  config = size_config(layers, 128, 4, seq_len, batch)
  graphdef, params = nnx.split(model_lib.create(config), nnx.Param)
  tx = optim.make_optimizer(config.train)
  opt_state = tx.init(params)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (batch, seq_len + 1)).astype(np.int32))
  loss_fn = make_loss_fn(graphdef)
  fwd = jax.jit(loss_fn)
  fwd_bwd = jax.jit(jax.value_and_grad(loss_fn))
  step = jax.jit(make_train_step(graphdef, tx))  # no donation: the same inputs are reused
  row = {"layers": layers, "seq_len": seq_len, "batch": batch,
         "forward_ms": best_ms(lambda: fwd(params, tokens), repeats),
         "fwd_bwd_ms": best_ms(lambda: fwd_bwd(params, tokens), repeats),
         "step_ms": best_ms(lambda: step(params, opt_state, tokens), repeats)}
  original = Attention.__call__
  Attention.__call__ = no_scores
  try:
    # A new function object: jit caches traces by function, and loss_fn's trace has the scores.
    no_scores_fwd = jax.jit(lambda p, t: loss_fn(p, t))
    row["forward_no_scores_ms"] = best_ms(lambda: no_scores_fwd(params, tokens), repeats)
  finally:
    Attention.__call__ = original
  return row


def analysis_row(layers: int, seq_len: int, batch: int, repeats: int) -> dict:
  config = size_config(layers, 128, 4, seq_len, batch)
  model = model_lib.create(config)
  graphdef, params = nnx.split(model, nnx.Param)
  visible = layer_visible(model.spec, seq_len)
  design = fixed_effects.make_design(visible)
  step = jax.jit(steps.make_baseline_step(graphdef, design, {}, jnp.arange(config.model.vocab_size)))
  acc = steps.init_accumulators(model.spec, seq_len, {}, AnalysisOptions().num_blocks)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (batch, seq_len)).astype(np.int32))
  return {"layers": layers, "seq_len": seq_len, "batch": batch,
          "analysis_ms": best_ms(lambda: step(params, acc, tokens, jnp.arange(batch)), repeats)}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seq_lens", default="128,256,512,1024,2048")
  p.add_argument("--depths", default="2,4,8")
  p.add_argument("--tokens", type=int, default=2048, help="tokens per step (batch = tokens / seq_len)")
  p.add_argument("--analysis_max_seq_len", type=int, default=1024,
                 help="longest analysis row (its captured logits grow as batch L H T^2)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", default="")
  args = p.parse_args()
  record = {"machine": common.machine(), "train": [], "analysis": []}
  shapes = [(4, int(t)) for t in args.seq_lens.split(",")] + [(int(l), 128) for l in args.depths.split(",")
                                                              if int(l) != 4]
  for layers, t in shapes:
    batch = max(1, args.tokens // t)
    r = train_row(layers, t, batch, args.repeats)
    record["train"].append(r)
    print(r, flush=True)
    if t <= args.analysis_max_seq_len:
      a = analysis_row(layers, t, batch, args.repeats)
      record["analysis"].append(a)
      print(a, flush=True)
  record["machine_after"] = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
  analysis = {(a["layers"], a["seq_len"]): a["analysis_ms"] for a in record["analysis"]}
  rows = []
  for r in record["train"]:
    tok = r["batch"] * r["seq_len"]
    rows.append([r["layers"], r["seq_len"], r["batch"], r["step_ms"], tok / r["step_ms"] * 1e3, r["forward_ms"],
                 r["fwd_bwd_ms"], r["forward_no_scores_ms"], analysis.get((r["layers"], r["seq_len"]), "-"),
                 tok / analysis[(r["layers"], r["seq_len"])] * 1e3 if (r["layers"], r["seq_len"]) in analysis else "-"])
  print(f'machine: {record["machine"]}')
  print(common.markdown_table(
      ["layers", "seq_len", "batch", "train step ms", "train tok/s", "forward ms", "forward+backward ms",
       "forward without scores ms", "analysis step ms", "analysis tok/s"], rows))
  print(f'load average before {record["machine"]["load_avg"]}, after {record["machine_after"]["load_avg"]}')
  common.write_json(args.json, record)


if __name__ == "__main__":
  main()
