"""Batch size and attention block from a memory budget: the largest batch whose compiled step fits.

XLA reports, per compiled program, the bytes of its arguments, outputs,
aliased (donated) buffers and scratch (``Compiled.memory_analysis()``). What a
step of the analysis pass allocates beyond the inputs already in memory
(parameters, accumulators) is ``scratch + outputs - aliased``; it grows
linearly in the batch size ``B`` (one layer's ``[B, H, T, T]`` logits and the
forward's activations), so two compilations (``B = 1`` and the largest ``B``)
give the line and a third confirms the chosen size. The attention runs in
blocks of queries (``attention.query_block_attention``): the largest block
whose logits per head stay within :data:`BLOCK_BYTES` (all ``T`` queries at
short ``T``), halved further while one sequence does not fit or its ``[H,
block, T]`` logits pass :data:`LOGITS_BYTES_CAP`: the step then grows with
``B * block * T``, not ``B * T^2`` (:func:`choose_batch_and_block`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import os
from collections.abc import Callable

import jax

from abspos_jax import attention

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


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
  name = ctypes.util.find_library("c")
  return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None


def release_free_pages() -> None:
  """Free what is unreachable and give the heap's free pages back to the OS.

  A dropped compiled program (which keeps its scratch once it has run) can
  sit in a reference cycle until the collector runs, hence ``gc.collect``.
  XLA's compilations and a sweep's temporaries are freed into the C heap's
  arenas, which keep the pages resident, hence glibc's ``malloc_trim`` (a
  no-op where the C library has none): after the memory budget's
  compilations, 0.4 of the 12 x 768 model's 1.6 GiB at 1,024 tokens
  (docs/benchmarks.md). The analysis calls this between its phases, so that
  its peak is what it holds, not what it once held.
  """
  gc.collect()
  trim = _malloc_trim()
  if trim is not None:
    trim(0)


# One layer's logits per step beyond this buy no speed on the CPU and cost fresh pages
# (docs/benchmarks.md: the 12 x 768 model at 2,048 tokens with 1 and 2 sequences per step).
LOGITS_BYTES_CAP = 256 * 2**20


MIN_QUERY_BLOCK = 16  # smaller blocks make too many small products to be worth it

# One head's block of logits, [R, T] float32, within this: the fold's dozen passes over it stay near a core's
# L2 cache (2 MiB here). Steady speed of SmolLM2's shape (30 x 576, 9 heads) against R: at 8,192 tokens R = 64
# (2 MiB) ran 1.29x R = 128 (4 MiB) and 1.13x R = 32 (1 MiB); at 4,096 tokens R = 128 (2 MiB) ran 1.08x R = 64
# (docs/benchmarks.md, "Query blocks and key bands").
BLOCK_BYTES = 2 * 2**20


# In blocks of queries, a step of this many tokens runs as fast per token as a larger one, and each further
# sequence costs its activations: the 12 x 768 model at 1,024 tokens in blocks of 256 ran 1, 2 and 4 sequences
# per step within noise (and 4 and 8 alike), its step 0.40 / 0.52 / 0.69 GiB (docs/benchmarks.md).
BLOCKED_STEP_TOKENS = 1024


def blocked_batch_cap(seq_len: int) -> int:
  """The batch of a step whose attention runs in blocks of queries: ``BLOCKED_STEP_TOKENS // seq_len``, >= 1."""
  return max(1, BLOCKED_STEP_TOKENS // seq_len)


def logits_batch_cap(num_heads: int, seq_len: int) -> int:
  """The largest batch whose float32 logits of one layer, ``[B, H, T, T]``, stay within ``LOGITS_BYTES_CAP``
  (>= 1), whatever the query block: in blocks the batch buys no more speed (the 12 x 768 model at 1,024
  tokens in blocks of 256: 531 tok/s at 4 sequences, 530 at 8) and its activations cost memory."""
  return max(1, LOGITS_BYTES_CAP // (num_heads * seq_len * seq_len * 4))


def query_blocks(seq_len: int, requested: int | None = None) -> list[int]:
  """The attention blocks to try, largest first: ``requested`` alone (it must divide ``seq_len``), else
  ``seq_len`` and its halvings down to :data:`MIN_QUERY_BLOCK`, from the first whose ``[block, seq_len]``
  float32 logits are within :data:`BLOCK_BYTES` and that is all ``seq_len`` queries or makes at least
  ``attention.KEY_BANDS`` blocks (the smallest halving where none is: an odd ``seq_len``). The second
  condition keeps every key band: at 1,024 tokens R = 256 (4 bands, 0.625 of the causal work) ran 1.2x R = 512
  (2 bands, 0.75)."""
  if requested is not None:
    if seq_len % requested:
      raise ValueError(f"query_block (analyze.py --query_block) must divide the sequence length {seq_len}, "
                       f"got {requested}")
    return [min(requested, seq_len)]
  out = [seq_len]
  while out[-1] % 2 == 0 and out[-1] // 2 >= MIN_QUERY_BLOCK:
    out.append(out[-1] // 2)
  fits = [b for b in out if b * seq_len * 4 <= BLOCK_BYTES and (b == seq_len or b * attention.KEY_BANDS <= seq_len)]
  return out[out.index(fits[0]):] if fits else out[-1:]


def even_batch(num_sequences: int, batch: int) -> int:
  """The largest ``b`` in ``[ceil(batch / 2), batch]`` that divides ``num_sequences``, else ``batch``: a sweep
  of equal batches compiles one program, where a smaller last batch compiles a second (for the 12 x 768
  model at 1,024 tokens, 12 s of a 3-minute analysis)."""
  for b in range(min(batch, num_sequences), (batch + 1) // 2 - 1, -1):
    if b >= 1 and num_sequences % b == 0:
      return b
  return batch


class DoesNotFit(ValueError):
  """One sequence's step needs more than the memory budget."""


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
    raise DoesNotFit(f"one sequence does not fit: {what} needs {one / GiB:.2f} GiB for a batch of 1 and the memory "
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


def choose_batch_and_block(compile_for: Callable[[int, int], object], max_batch: int, budget: int,
                           blocks: list[int], num_heads: int, seq_len: int,
                           what: str = "the analysis step", num_sequences: int | None = None
                           ) -> tuple[int, int, int]:
  """``(B, block, bytes)``: the largest block of ``blocks`` (largest first) whose logits for one sequence stay
  within :data:`LOGITS_BYTES_CAP` (the last one otherwise) and whose step fits ``budget`` for one sequence,
  with the largest batch that then fits (:func:`choose_batch_size`; ``compile_for(B, block)``) under
  :func:`logits_batch_cap` and, in blocks, :func:`blocked_batch_cap`, tried first at :func:`even_batch` of
  ``num_sequences`` when given.

  Raises ``ValueError`` before any work when one sequence does not fit at the smallest block.
  """
  within_cap = [b for b in blocks if num_heads * b * seq_len * 4 <= LOGITS_BYTES_CAP] or blocks[-1:]
  for block in within_cap:
    try:
      top = min(max_batch, logits_batch_cap(num_heads, seq_len),
                *([blocked_batch_cap(seq_len)] if block < seq_len else []))
      batch, used = choose_batch_size(lambda b: compile_for(b, block),
                                      top if num_sequences is None else even_batch(num_sequences, top), budget,
                                      what=f"{what} in blocks of {block} queries")
      return batch, block, used
    except DoesNotFit as e:
      last = e
  raise DoesNotFit(f"{last}; no smaller query block is left to try (the smallest is {within_cap[-1]}: "
                   f"--query_block, or --memory_budget_gb)")
