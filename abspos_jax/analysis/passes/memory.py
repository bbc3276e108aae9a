"""Batch size from a memory budget: the largest batch whose compiled step fits.

XLA reports, per compiled program, the bytes of its arguments, outputs,
aliased (donated) buffers and scratch (``Compiled.memory_analysis()``). What a
step of the analysis pass allocates beyond the inputs already in memory
(parameters, accumulators) is ``scratch + outputs - aliased``; it grows
linearly in the batch size ``B`` (one layer's ``[B, H, T, T]`` logits and the
forward's activations), so two compilations (``B = 1`` and the largest ``B``)
give the line and a third confirms the chosen size.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax

GiB = 2**30


def available_bytes(device: jax.Device | None = None) -> int:
  """Memory free now: the device's limit minus its use on an accelerator, ``MemAvailable`` on the host."""
  device = device or jax.devices()[0]
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


# One layer's logits per step beyond this buy no speed on the CPU and cost fresh pages
# (docs/benchmarks.md: the 12 x 768 model at 2,048 tokens with 1 and 2 sequences per step).
LOGITS_BYTES_CAP = 256 * 2**20


def logits_batch_cap(num_heads: int, seq_len: int) -> int:
  """The largest batch whose one layer of float32 logits ``[B, H, T, T]`` stays within ``LOGITS_BYTES_CAP`` (>= 1)."""
  return max(1, LOGITS_BYTES_CAP // (num_heads * seq_len * seq_len * 4))


def step_bytes(compiled) -> int:
  """What one call of ``compiled`` allocates beyond its inputs: ``scratch + outputs - aliased``."""
  m = compiled.memory_analysis()
  return int(m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes)


def choose_batch_size(compile_for: Callable[[int], object], max_batch: int, budget: int,
                      what: str = "the analysis step") -> tuple[int, int]:
  """The largest ``B <= max_batch`` with ``step_bytes(compile_for(B)) <= budget``: ``(B, its bytes)``.

  ``compile_for(B)`` returns the compiled program for a batch of ``B``.
  Raises ``ValueError`` when one sequence does not fit.
  """
  top = step_bytes(compile_for(max_batch))
  if top <= budget:
    return max_batch, top
  one = step_bytes(compile_for(1)) if max_batch > 1 else top
  if one > budget:
    raise ValueError(f"one sequence does not fit: {what} needs {one / GiB:.2f} GiB for a batch of 1 and the memory "
                     f"budget is {budget / GiB:.2f} GiB; raise memory_budget_gb (analyze.py --memory_budget_gb) or "
                     f"analyse shorter sequences (--seq_len)")
  per_seq = max((top - one) / (max_batch - 1), 1.0)
  b = max(1, min(max_batch - 1, int(1 + (budget - one) // per_seq)))
  while b > 1:
    used = step_bytes(compile_for(b))
    if used <= budget:
      return b, used
    b = max(1, int(b * budget / used))
  return 1, one
