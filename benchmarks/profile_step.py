"""Where a train step's time goes: ours (XLA ops) and the PyTorch reference (aten ops), by kind of work.

    python -m benchmarks.profile_step [--size=tiny] [--dtype=float32] [--steps=5] [--top=12] [--json=out.json]

Ours: a ``jax.profiler`` trace of ``--steps`` jitted train steps (the step of
:mod:`benchmarks.train_throughput`), read back from its Perfetto JSON; every
XLA op the CPU runtime executed is matched to its instruction in the compiled
HLO and put in one kind:

- ``dense matmul``: a fusion or op containing a ``dot`` without batch
  dimensions (projections, MLP, unembedding and their gradients);
- ``attention matmul``: a ``dot`` with batch dimensions (``q.k``, ``a.v`` and
  their gradients, per batch and head), with whatever XLA fused into it;
- ``layout copy``: no dot, but a ``transpose`` or a layout-changing ``copy``
  (often with elementwise work fused in, e.g. an activation's backward);
- ``elementwise``: the rest (softmax, norms, RoPE, activations, the optimizer).

PyTorch: ``torch.profiler`` over the same number of steps of
:mod:`benchmarks.torch_reference`, self CPU time per aten op: ``mm``/``addmm``
are dense matmuls; ``bmm`` and the fused ``scaled_dot_product_attention``
kernels (forward and backward) attention; ``copy_``/``clone``/``contiguous``
layout copies; the rest elementwise.

Per-op times are summed, so with intra-op threads they are wall time of the
calling thread, not CPU-seconds. Profiling costs time, PyTorch's per-op
instrumentation far more than XLA's (its step is hundreds of small eager ops),
so the script also prints each side's unprofiled step time (interleaved
median of 3): read the kinds as shares of each side's own total.

``--dtype=bfloat16`` profiles the mixed-precision steps: ours with
``model.dtype=bfloat16``, PyTorch under ``torch.autocast("cpu", dtype=torch.bfloat16)``.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import numpy as np
import torch

from benchmarks import common
from benchmarks.train_throughput import SIZES, Ours, Reference, size_config

KINDS = ("dense matmul", "attention matmul", "layout copy", "elementwise")


def hlo_computations(hlo_text: str) -> dict[str, str]:
  """Computation name -> its body, from ``compiled.as_text()``."""
  comps, name, body = {}, None, []
  for line in hlo_text.splitlines():
    m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
    if m and name is None:
      name, body = m.group(1), []
    elif line.startswith("}") and name is not None:
      comps[name] = "\n".join(body)
      name = None
    elif name is not None:
      body.append(line)
  return comps


def xla_op_kinds(hlo_text: str) -> dict[str, tuple[str, str]]:
  """Instruction name -> (kind, output shape) for every instruction of the compiled module."""
  comps = hlo_computations(hlo_text)
  out = {}
  for body in comps.values():
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)$", body, re.M):
      name, shape, op, rest = m.groups()
      called = re.search(r"calls=%([\w.\-]+)", rest)
      text = comps.get(called.group(1), "") if called else f"{op}({rest}"
      if re.search(r"\bdot\(", text):
        kind = "attention matmul" if "lhs_batch_dims" in text else "dense matmul"
      elif re.search(r"\b(transpose|copy)\(", text) or op in ("copy", "transpose"):
        kind = "layout copy"
      else:
        kind = "elementwise"
      out[name] = (kind, re.sub(r"\{.*", "", shape))
  return out


def profile_ours(ours: Ours, steps: int) -> tuple[dict, list]:
  kinds = xla_op_kinds(ours.step_fn.lower(ours.params, ours.opt_state, ours.batches[0]).compile().as_text())
  with tempfile.TemporaryDirectory() as d:
    jax.profiler.start_trace(d, create_perfetto_trace=True)
    ours.run(steps)
    jax.profiler.stop_trace()
    trace = json.load(gzip.open(glob.glob(os.path.join(d, "**", "*.json.gz"), recursive=True)[0]))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  by_kind, by_op = collections.Counter(), collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in kinds:
      kind, shape = kinds[e["name"]]
      by_kind[kind] += e["dur"] / 1e3 / steps
      by_op[(kind, re.sub(r"\.\d+$", "", e["name"]), shape)] += e["dur"] / 1e3 / steps
  return dict(by_kind), by_op.most_common()


def torch_kind(name: str) -> str:
  if name in ("aten::mm", "aten::addmm"):
    return "dense matmul"
  if name == "aten::bmm" or "scaled_dot_product" in name or "flash_attention" in name:
    return "attention matmul"
  if name in ("aten::copy_", "aten::clone", "aten::contiguous"):
    return "layout copy"
  return "elementwise"


def profile_reference(ref: Reference, steps: int) -> tuple[dict, list]:
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    ref.run(steps)
  by_kind, by_op = collections.Counter(), collections.Counter()
  for e in prof.key_averages():
    ms, kind = e.self_cpu_time_total / 1e3 / steps, torch_kind(e.key)
    by_kind[kind] += ms
    by_op[(kind, e.key, "")] += ms
  return dict(by_kind), by_op.most_common()


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="tiny", help=f"one of {sorted(SIZES)}")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="compute dtype of both sides")
  p.add_argument("--steps", type=int, default=5, help="train steps profiled on each side")
  p.add_argument("--top", type=int, default=12, help="largest single ops listed per side")
  p.add_argument("--json", default="", help="write the breakdown here")
  args = p.parse_args()
  if args.size not in SIZES:
    raise SystemExit(f"--size: unknown size {args.size!r}; choose from {sorted(SIZES)}")
  torch.set_num_threads(os.cpu_count())
  dims = SIZES[args.size]
  config = size_config(*dims, dtype=args.dtype)
  batches = np.random.default_rng(0).integers(0, config.model.vocab_size, (4, dims[4], dims[3] + 1)).astype(np.int32)
  ours_step = Ours(config, batches)
  ref_step = Reference(config, ours_step.model, batches, autocast=args.dtype == "bfloat16")
  ours_step.run(3)
  ref_step.run(2)
  unprofiled = common.interleaved({"ours": lambda: ours_step.run(args.steps), "pytorch": lambda: ref_step.run(args.steps)}, 3)
  unprofiled = {k: 1e3 * common.median(v) / args.steps for k, v in unprofiled.items()}
  ref, ref_ops = profile_reference(ref_step, args.steps)
  ours, ours_ops = profile_ours(ours_step, args.steps)
  def share(k: str, side: dict) -> str:
    return f"{side.get(k, 0.0):.1f} ({side.get(k, 0.0) / sum(side.values()):.0%})"
  rows = [[k, share(k, ours), share(k, ref)] for k in KINDS]
  rows.append(["total of profiled ops", sum(ours.values()), sum(ref.values())])
  rows.append(["unprofiled step", unprofiled["ours"], unprofiled["pytorch"]])
  print(f"machine: {common.machine()}")
  print(f"size {args.size} {dims} {args.dtype} (layers, d_model, heads, seq_len, batch); ms per train step, summed op times")
  print(common.markdown_table(["kind", "ours ms (share)", "PyTorch ms (share)"], rows))
  for side, ops in (("ours", ours_ops), ("PyTorch", ref_ops)):
    print(f"\nlargest ops, {side} (ms per step, summed over instances):")
    print(common.markdown_table(["kind", "op", "shape", "ms"], [[k, n, s, ms] for (k, n, s), ms in ops[:args.top]]))
  common.write_json(args.json, {"size": args.size, "dims": dims, "dtype": args.dtype, "ours": ours, "pytorch": ref, "unprofiled_ms": unprofiled,
                                "ours_ops": [[*k, v] for k, v in ours_ops], "pytorch_ops": [[*k, v] for k, v in ref_ops]})


if __name__ == "__main__":
  main()
