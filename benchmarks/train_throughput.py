"""Training throughput: our jitted train step against a straightforward PyTorch loop.

    python -m benchmarks.train_throughput [--sizes=tiny,medium] [--dtype=float32] [--repeats=7] [--steps=5] [--json=out.json]

Both sides train the same architecture from the same weights (copied from our
initialisation into :mod:`benchmarks.torch_reference`) on the same batches with
the same AdamW hyper-parameters and clipping; the first loss of each must agree
before anything is timed. Each repeat times ``--steps`` optimizer steps of each
side, interleaved (see :mod:`benchmarks.common`); reported are median tokens/s,
the ratio ours / PyTorch, and MFU = tokens/s * FLOPs per token / peak with the
FLOP count of :mod:`abspos_jax.flops` and a measured float32 matmul peak of each
library on this machine.

``--dtype=bfloat16`` times four contenders in the same interleaved repeats:
our step with ``model.dtype=bfloat16`` (float32 master weights and optimizer
state, bf16 matmul inputs), PyTorch under ``torch.autocast("cpu",
dtype=torch.bfloat16)`` on the same float32 weights, and the float32 pair; the
table gives bf16 / f32 for ours, ours / PyTorch in bf16 and in f32. The first
bf16 losses must agree with the float32 loss within bf16 rounding.
"""

import argparse
import os
import time

import jax
import numpy as np
import torch
from flax import nnx

from abspos_jax import attention_kernels, flops, model as model_lib, optim
from abspos_jax.config import base_config
from abspos_jax.train_step import make_train_step
from benchmarks import common, torch_reference

SIZES = {  # name -> (num_layers, d_model, num_heads, seq_len, batch_size)
    "tiny": (4, 128, 4, 128, 32),  # configs/tiny.py
    "medium": (4, 256, 4, 256, 16),
}


def size_config(layers: int, d_model: int, heads: int, seq_len: int, batch: int, **model_overrides):
  c = base_config()
  c.model.update(position="rope", num_layers=layers, d_model=d_model, num_heads=heads, **model_overrides)
  c.data.seq_len, c.train.batch_size = seq_len, batch
  return c


def torch_peak_flops(n: int = 1024, repeats: int = 5) -> float:
  """Best float32 FLOP/s of ``[n, n] @ [n, n]`` in PyTorch (the counterpart of ``flops.measured_peak_flops``)."""
  a = torch.ones(n, n)
  a @ a
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    a @ a
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n**3 / best


class Ours:
  """Our jitted, donating train step with the real optimizer, stepping through a fixed set of batches."""

  def __init__(self, config, batches: np.ndarray):
    model = model_lib.create(config)
    self.graphdef, self.params = nnx.split(model, nnx.Param)
    self.model = model
    tx = optim.make_optimizer(config.train)
    self.opt_state = tx.init(self.params)
    self.step_fn = jax.jit(make_train_step(self.graphdef, tx, loss_chunk=config.train.loss_chunk),
                           donate_argnums=(0, 1))
    spec = model.spec
    self.kernel = attention_kernels.resolve(spec.attention_impl, dtype=spec.dtype, head_dim=spec.head_dim,
                                            seq_len=config.data.seq_len)
    self.batches = [jax.numpy.asarray(b) for b in batches]
    self.i = 0

  def step(self) -> jax.Array:
    self.params, self.opt_state, m = self.step_fn(self.params, self.opt_state, self.batches[self.i % len(self.batches)])
    self.i += 1
    return m["loss"]

  def run(self, steps: int) -> None:
    for _ in range(steps):
      loss = self.step()
    loss.block_until_ready()


class Reference:
  """The PyTorch loop on the same weights and batches (under bf16 autocast with ``autocast=True``)."""

  def __init__(self, config, jax_model, batches: np.ndarray, compile: bool = False, autocast: bool = False):
    self.model = torch_reference.Decoder(jax_model.spec)
    torch_reference.load_from_jax(self.model, jax_model)
    self.opt = torch_reference.make_optimizer(self.model, config.train)
    self.forward = torch.compile(self.model) if compile else self.model
    self.batches = [torch.from_numpy(b.astype(np.int64)) for b in batches]
    self.clip = config.train.grad_clip
    self.autocast = autocast
    self.i = 0

  def step(self) -> float:
    loss = torch_reference.train_step(self.forward, self.opt, self.batches[self.i % len(self.batches)], self.clip,
                                      self.autocast)
    self.i += 1
    return loss

  def run(self, steps: int) -> None:
    for _ in range(steps):
      self.step()


def bench_size(name: str, dims: tuple, repeats: int, steps: int, with_compile: bool, dtype: str = "float32") -> dict:
  config = size_config(*dims)
  layers, d_model, heads, seq_len, batch = dims
  rng = np.random.default_rng(0)
  batches = rng.integers(0, config.model.vocab_size, (4, batch, seq_len + 1)).astype(np.int32)
  ours = Ours(config, batches)
  ref = Reference(config, ours.model, batches)
  # The same function from the same weights: the first losses agree (both float32).
  first = {"ours": float(ours.step()), "pytorch": ref.step()}
  if not np.isclose(first["ours"], first["pytorch"], rtol=1e-4):
    raise AssertionError(f"{name}: first loss differs: ours {first['ours']} vs PyTorch {first['pytorch']}")
  contenders = {"ours": lambda: ours.run(steps), "pytorch": lambda: ref.run(steps)}
  warm = [ours, ref]
  if dtype == "bfloat16":
    ours_bf16 = Ours(size_config(*dims, dtype="bfloat16"), batches)
    ref_bf16 = Reference(config, ours_bf16.model, batches, autocast=True)
    first |= {"ours_bf16": float(ours_bf16.step()), "pytorch_bf16": ref_bf16.step()}
    # bf16 inputs round each matmul operand to 8 bits of mantissa: the first loss moves by ~1e-3 relative.
    for k in ("ours_bf16", "pytorch_bf16"):
      if not np.isclose(first[k], first["ours"], rtol=1e-2):
        raise AssertionError(f"{name}: first bf16 loss {k} {first[k]} is far from the float32 loss {first['ours']}")
    contenders |= {"ours_bf16": lambda: ours_bf16.run(steps), "pytorch_bf16": lambda: ref_bf16.run(steps)}
    warm += [ours_bf16, ref_bf16]
  if with_compile:
    compiled = Reference(config, ours.model, batches, compile=True)
    compiled.run(2)  # compile outside the timed region
    contenders["pytorch_compile"] = lambda: compiled.run(steps)
  for side in warm:
    side.run(1)
  times = common.interleaved(contenders, repeats)
  tokens = steps * batch * seq_len
  spec = ours.model.spec
  return {"size": name, "num_layers": layers, "d_model": d_model, "num_heads": heads, "seq_len": seq_len,
          "batch_size": batch, "flops_per_token": flops.train_flops_per_token(spec, seq_len),
          "first_loss": first, "tokens_per_s": {k: tokens / common.median(v) for k, v in times.items()},
          "seconds": times}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="tiny,medium", help=f"comma-separated, from {sorted(SIZES)}")
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--steps", type=int, default=5, help="optimizer steps per timed repeat")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="bfloat16: also time both sides in mixed precision (see the module docstring)")
  p.add_argument("--torch_compile", action="store_true", help="also time torch.compile of the reference")
  p.add_argument("--json", default="", help="write every measurement here")
  args = p.parse_args()
  torch.set_num_threads(os.cpu_count())
  sizes = args.sizes.split(",")
  for s in sizes:
    if s not in SIZES:
      raise SystemExit(f"--sizes: unknown size {s!r}; choose from {sorted(SIZES)}")
  record = {"machine": common.machine(), "peak_flops": {"jax": flops.measured_peak_flops(),
                                                        "torch": torch_peak_flops()}, "results": []}
  for s in sizes:
    record["results"].append(bench_size(s, SIZES[s], args.repeats, args.steps, args.torch_compile, args.dtype))
  record["machine_after"] = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
  peak_jax, peak_torch = record["peak_flops"]["jax"], record["peak_flops"]["torch"]
  extra = ["pytorch_compile"] if args.torch_compile else []
  rows = []
  for r in record["results"]:
    tps = r["tokens_per_s"]
    rows.append([r["size"], f'{r["num_layers"]}x{r["d_model"]}, T={r["seq_len"]}, B={r["batch_size"]}',
                 tps["ours"], tps["pytorch"], *[tps[e] for e in extra], f'{tps["ours"] / tps["pytorch"]:.2f}',
                 f'{tps["ours"] * r["flops_per_token"] / peak_jax:.1%}',
                 f'{tps["pytorch"] * r["flops_per_token"] / peak_torch:.1%}'])
  print(f'machine: {record["machine"]}')
  print(f"measured float32 matmul peak: jax {peak_jax / 1e9:.1f} GFLOP/s, torch {peak_torch / 1e9:.1f} GFLOP/s")
  print(common.markdown_table(
      ["size", "shape", "ours tok/s", "PyTorch tok/s", *[e + " tok/s" for e in extra], "ours / PyTorch",
       "MFU ours", "MFU PyTorch"], rows))
  if args.dtype == "bfloat16":
    print("\nbfloat16 (ours: model.dtype=bfloat16; PyTorch: torch.autocast bf16), same repeats:")
    print(common.markdown_table(
        ["size", "ours bf16 tok/s", "PyTorch bf16 tok/s", "ours bf16 / ours f32", "ours bf16 / PyTorch bf16",
         "ours f32 / PyTorch f32", "first loss ours f32 / bf16 / PyTorch bf16"],
        [[r["size"], r["tokens_per_s"]["ours_bf16"], r["tokens_per_s"]["pytorch_bf16"],
          f'{r["tokens_per_s"]["ours_bf16"] / r["tokens_per_s"]["ours"]:.2f}',
          f'{r["tokens_per_s"]["ours_bf16"] / r["tokens_per_s"]["pytorch_bf16"]:.2f}',
          f'{r["tokens_per_s"]["ours"] / r["tokens_per_s"]["pytorch"]:.2f}',
          " / ".join(f'{r["first_loss"][k]:.5f}' for k in ("ours", "ours_bf16", "pytorch_bf16"))]
         for r in record["results"]]))
  print(f'load average before {record["machine"]["load_avg"]}, after {record["machine_after"]["load_avg"]}')
  common.write_json(args.json, record)


if __name__ == "__main__":
  main()
