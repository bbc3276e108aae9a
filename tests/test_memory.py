"""The analysis memory model (analysis/passes/memory.py): the batch size from compiled sizes, the logits cap, the
budget option."""

import types

import numpy as np
import pytest

from abspos_jax import model as model_lib
from abspos_jax.analysis import AnalysisOptions, analyze
from abspos_jax.analysis.passes import memory
from conftest import small_config
from helpers import sequences


def test_choose_batch_size_from_a_linear_memory_model():
  """A step that allocates ``100 + 10 B`` bytes: budget 165 -> B = 6 (160 bytes), 2 compilations plus the check."""
  compiled = []

  def compile_for(b):
    compiled.append(b)
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        temp_size_in_bytes=100 + 10 * b, output_size_in_bytes=7, alias_size_in_bytes=7))

  assert memory.choose_batch_size(compile_for, 32, 165) == (6, 160) and compiled == [32, 1, 6]
  assert memory.choose_batch_size(compile_for, 32, 10**6) == (32, 420)
  with pytest.raises(ValueError, match="one sequence does not fit.*memory_budget_gb"):
    memory.choose_batch_size(compile_for, 32, 109)


def test_the_batch_holds_at_most_256_mib_of_one_layers_logits():
  """[B, H, T, T] float32 within 256 MiB: 12 heads at 1,024 tokens -> 5 sequences, at 2,048 -> 1, never 0."""
  assert memory.logits_batch_cap(12, 1024) == 5
  assert memory.logits_batch_cap(12, 2048) == 1 and memory.logits_batch_cap(32, 8192) == 1
  assert memory.logits_batch_cap(4, 128) == 1024


def test_a_blocked_step_holds_1024_tokens():
  """In blocks of queries the batch is 1,024 tokens' worth (at least one sequence), under the logits cap: 12 heads
  at 1,024 tokens in blocks of 256 -> 1 sequence (not 5), 64 tokens in blocks of 16 -> 16; all T at once -> the
  logits cap alone."""
  assert memory.blocked_batch_cap(1024) == 1 and memory.blocked_batch_cap(4096) == 1
  assert memory.blocked_batch_cap(64) == 16
  compiled = []

  def compile_for(b, block):
    compiled.append((b, block))
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        temp_size_in_bytes=10 * b, output_size_in_bytes=0, alias_size_in_bytes=0))

  assert memory.choose_batch_and_block(compile_for, 32, 10**6, [256, 128], 12, 1024, num_sequences=32)[:2] == (1, 256)
  assert memory.choose_batch_and_block(compile_for, 32, 10**6, [16], 4, 64, num_sequences=32)[:2] == (16, 16)
  assert memory.choose_batch_and_block(compile_for, 32, 10**6, [64], 4, 64, num_sequences=32)[:2] == (32, 64)


def test_query_blocks_start_where_a_heads_block_fits_the_cache():
  """[R, T] float32 per head within 2 MiB, and all T or at least 4 blocks (every key band): all T up to 512
  tokens, 256 at 1,024 and 2,048, 128 at 4,096, 64 at 8,192; then halvings down to 16 for the memory budget; an
  odd length has only itself; a request alone."""
  assert memory.query_blocks(16) == [16] and memory.query_blocks(512) == [512, 256, 128, 64, 32, 16]
  assert memory.query_blocks(1024) == [256, 128, 64, 32, 16] and memory.query_blocks(2048)[0] == 256
  assert memory.query_blocks(4096)[0] == 128 and memory.query_blocks(8192) == [64, 32, 16]
  assert memory.query_blocks(999) == [999] and memory.query_blocks(1000) == [250, 125]
  assert memory.query_blocks(4096, 1024) == [1024]


def test_batches_are_cut_equal_where_that_costs_at_most_half_the_batch():
  """32 sequences under a cap of 5 -> 8 batches of 4 (one program, not 5s and a 2); no divisor in [ceil(b/2), b]
  keeps the cap; fewer sequences than the cap -> one batch of all."""
  assert memory.even_batch(32, 5) == 4 and memory.even_batch(12, 5) == 4 and memory.even_batch(100, 32) == 25
  assert memory.even_batch(256, 32) == 32 and memory.even_batch(7, 5) == 5 and memory.even_batch(23, 8) == 8
  assert memory.even_batch(3, 5) == 3 and memory.even_batch(5, 1) == 1
  compiled = []

  def compile_for(b, block):
    compiled.append((b, block))
    return types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
        temp_size_in_bytes=10 * b, output_size_in_bytes=0, alias_size_in_bytes=0))

  assert memory.choose_batch_and_block(compile_for, 5, 10**6, [16], 4, 16, num_sequences=12) == (4, 16, 40)
  assert compiled == [(4, 16)]  # the one program the sweep then runs


def test_memory_budget_sets_the_batch_size():
  m, seqs = model_lib.create(small_config()), sequences()
  whole = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False))
  assert whole.summary["batch_size"] == 12
  budget = 0.6 * whole.summary["memory"]["step_gib"]
  small = analyze(m, seqs, options=AnalysisOptions(batch_size=12, interventions=False, progress=False,
                                                   memory_budget_gb=budget))
  assert 1 <= small.summary["batch_size"] < 12 and small.summary["memory"]["step_gib"] <= budget
  for name in ("log_z", "phi_s", "share_res", "probe_resid_r2"):
    np.testing.assert_allclose(small.stats[name], whole.stats[name], rtol=1e-4, atol=1e-5, err_msg=name)
  with pytest.raises(ValueError, match="one sequence does not fit"):
    analyze(m, seqs, options=AnalysisOptions(interventions=False, progress=False, memory_budget_gb=1e-6))
