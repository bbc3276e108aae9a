"""Train-step throughput and MFU on an accelerator: float32 against bfloat16, and the attention kernels, up
to GPT-2-small size.

    python -m benchmarks.accelerator_mfu [--sizes=medium,medium_b128,paper_gpu_L4,paper_gpu_L8] [--repeats=5] [--steps=10] [--json=out.json]
    python -m benchmarks.accelerator_mfu --sizes=gpt2_small --variants=bfloat16:xla,bfloat16:cudnn

Times our jitted, donating train step (:class:`benchmarks.train_throughput.Ours`:
the real AdamW with clipping, float32 master weights and optimizer state) for
each variant ``DTYPE[:ATTENTION_IMPL[:LOSS_CHUNK]]`` (``model.dtype``,
``model.attention_impl``, ``train.loss_chunk``), interleaved per size (see
:mod:`benchmarks.common`). Every variant's first loss must be within 1e-2 of the
first variant's. MFU = tokens/s x training FLOPs per token / peak, with the
attention counted two ways (:func:`abspos_jax.flops.train_flops_per_token`):
over all keys (``6 N + 12 L T D``) and over the keys each query sees (half of
that term when causal, MaxText's convention); against two peaks: the bf16
matmul peak measured here (``jnp.dot`` of two random ``[8192, 8192]`` bf16
matrices, float32 accumulation) and the datasheet peak of
``flops.KNOWN_PEAKS`` where the device is listed. The float32 rows are
divided by the same bf16 peak, so they read as the share of the chip's
matmul rate, not of its float32 rate. Meant for a GPU or TPU; on a CPU it runs
but says nothing the CPU benchmarks do not.
"""

import argparse

import jax
import numpy as np

from abspos_jax import flops
from benchmarks import common
from benchmarks.train_throughput import Ours, size_config

SIZES = {  # name -> (num_layers, d_model, num_heads, seq_len, batch_size, vocab_size, position)
    "tiny": (4, 128, 4, 128, 32, 256, "rope"),  # configs/tiny.py; for a quick check on the CPU
    "medium": (4, 256, 4, 256, 16, 256, "rope"),  # benchmarks.train_throughput's medium
    "medium_b128": (4, 256, 4, 256, 128, 256, "rope"),  # the same model with a batch that fills an accelerator
    "paper_gpu_L4": (4, 512, 8, 512, 64, 256, "rope"),  # configs/sweeps/paper_gpu.py, 4 layers
    "paper_gpu_L8": (8, 512, 8, 512, 64, 256, "rope"),  # configs/sweeps/paper_gpu.py, 8 layers
    "gpt2_small": (12, 768, 12, 1024, 32, 50304, "rope"),  # GPT-2 small (124M; vocabulary padded to 64 x 786)
    "gpt2_small_swa": (12, 768, 12, 1024, 32, 50304, "swa"),  # the same with a 256-key window in every layer
}
SWA_WINDOW = 256
VARIANTS = "float32,bfloat16"


def parse_variant(v: str) -> dict:
  """``DTYPE[:ATTENTION_IMPL[:LOSS_CHUNK]]`` -> config overrides."""
  parts = v.split(":")
  dtype, impl, chunk = parts + ["xla", "0"][len(parts) - 1:]
  return {"model.dtype": dtype, "model.attention_impl": impl, "train.loss_chunk": int(chunk)}


def bench_size(name: str, variants: list[str], repeats: int, steps: int) -> dict:
  layers, d_model, heads, seq_len, batch, vocab, position = SIZES[name]
  batches = np.random.default_rng(0).integers(0, vocab, (4, batch, seq_len + 1)).astype(np.int32)
  sides = {}
  for v in variants:
    c = size_config(layers, d_model, heads, seq_len, batch, vocab_size=vocab)
    c.model.position, c.model.window = position, SWA_WINDOW
    for key, value in parse_variant(v).items():
      section, field = key.split(".")
      c[section][field] = value
    sides[v] = Ours(c, batches)
  first = {v: float(side.step()) for v, side in sides.items()}
  for v in variants[1:]:
    if not np.isclose(first[v], first[variants[0]], rtol=1e-2):
      raise AssertionError(f"{name}: first loss of {v} {first[v]} is far from {variants[0]}'s {first[variants[0]]}")
  for side in sides.values():
    side.run(2)  # compiled and warm before timing
  times = common.interleaved({v: (lambda s=side: s.run(steps)) for v, side in sides.items()}, repeats)
  tokens = steps * batch * seq_len
  return {"size": name, "num_layers": layers, "d_model": d_model, "num_heads": heads, "seq_len": seq_len,
          "batch_size": batch, "vocab_size": vocab,
          "position": position, "window": SWA_WINDOW if position == "swa" else None,
          "flops_per_token": flops.train_flops_per_token(sides[variants[0]].model.spec, seq_len),
          "flops_per_token_causal_half": flops.train_flops_per_token(sides[variants[0]].model.spec, seq_len, True),
          "attention_kernel": {v: side.kernel for v, side in sides.items()},
          "first_loss": first, "tokens_per_s": {v: tokens / common.median(t) for v, t in times.items()},
          "seconds": times}


def table(record: dict) -> str:
  """One row per size and variant. MFU columns: ``full`` counts the attention over all ``T`` keys
  (``6 N + 12 L T D``), ``causal`` only the keys each query sees (``6 N + 6 L T D`` without a window,
  MaxText's convention; ``flops.train_flops_per_token``); against the datasheet bf16 peak and the measured
  ``jnp.dot`` peak."""
  measured, sheet = record["peak_flops"]["measured_bf16"], record["peak_flops"]["datasheet_bf16"]
  pct = lambda achieved, peak: f"{achieved / peak:.1%}" if peak else "n/a"
  rows = []
  for r in record["results"]:
    tps = r["tokens_per_s"]
    variants = list(tps)
    for v in variants:
      full = tps[v] * r["flops_per_token"]
      half = tps[v] * r.get("flops_per_token_causal_half", r["flops_per_token"])
      rows.append([r["size"], f'{r["num_layers"]}x{r["d_model"]}, T={r["seq_len"]}, B={r["batch_size"]}', v,
                   r.get("attention_kernel", {}).get(v, "xla"), tps[v], f"{full / 1e12:.1f}", pct(full, sheet),
                   pct(half, sheet), pct(full, measured),
                   f"{tps[v] / tps[variants[0]]:.2f}" if v != variants[0] else ""])
  return common.markdown_table(["size", "shape", "variant", "kernel", "tok/s", "TFLOP/s (full)",
                                "MFU datasheet, full", "MFU datasheet, causal", "MFU measured peak, full",
                                "/ first variant"], rows)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="medium,medium_b128,paper_gpu_L4,paper_gpu_L8",
                 help=f"comma-separated, from {sorted(SIZES)}")
  p.add_argument("--variants", default=VARIANTS,
                 help="comma-separated DTYPE[:ATTENTION_IMPL[:LOSS_CHUNK]], timed side by side; the first is the "
                      "reference")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--steps", type=int, default=10, help="optimizer steps per timed repeat")
  p.add_argument("--peak_n", type=int, default=8192, help="side of the square bf16 matmul that measures the peak")
  p.add_argument("--json", default="", help="write every measurement here (rewritten after each size)")
  args = p.parse_args()
  sizes = args.sizes.split(",")
  for s in sizes:
    if s not in SIZES:
      raise SystemExit(f"--sizes: unknown size {s!r}; choose from {sorted(SIZES)}")
  record = {"machine": common.machine(), "device_kind": jax.devices()[0].device_kind,
            "peak_flops": {"measured_bf16": flops.measured_peak_flops(args.peak_n, 10, "bfloat16"),
                           "datasheet_bf16": flops.known_peak(jax.devices()[0].device_kind)}, "results": []}
  print(f'{record["device_kind"]}: measured bf16 matmul peak {record["peak_flops"]["measured_bf16"] / 1e12:.1f} '
        f'TFLOP/s, datasheet {record["peak_flops"]["datasheet_bf16"] / 1e12:.0f}', flush=True)
  for s in sizes:
    record["results"].append(bench_size(s, args.variants.split(","), args.repeats, args.steps))
    common.write_json(args.json, record)
    print(table({**record, "results": record["results"][-1:]}), flush=True)
  print(table(record))


if __name__ == "__main__":
  main()
