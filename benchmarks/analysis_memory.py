"""What one analysis step allocates at long contexts, with the attention whole and in blocks of queries.

    python -m benchmarks.analysis_memory [--seq_lens=1024,4096,8192,16384]

For each model shape (the random 12 x 768 x 12 RoPE decoder, and SmolLM2-135M's
shape: 30 x 576, 9 query / 3 key-value heads, vocabulary 49,152, tied) and
each length, the baseline step of ``analyze`` (``steps.make_baseline_step``,
interventions off) is compiled for one sequence, never run: once with every
layer's attention over all ``T`` queries, once at the query block
``analyze``'s memory budget picks (``memory.choose_batch_and_block``, with its
256 MiB cap on one block's logits). Each row gives what XLA's memory analysis
says the step allocates beyond its inputs (``memory.step_bytes``: scratch +
outputs - donated buffers), the figure the memory budget reads, and the
accumulators the analysis holds beside it. Parameters stay abstract
(``nnx.eval_shape``), so nothing of the model's size is allocated and a
16,384-token step can be measured on a small machine; compiling is the cost.
"""

import argparse

import jax
import jax.numpy as jnp
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax.analysis.core import layer_visible
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.passes import memory, steps
from benchmarks import common
from benchmarks.train_throughput import size_config

SHAPES = {  # name -> (layers, d_model, heads, kv heads, vocabulary, SwiGLU width; 0: the default 8/3 d_model)
    "12x768": (12, 768, 12, 0, 259, 0),
    "SmolLM2-135M": (30, 576, 9, 3, 49152, 1536),
}


def _bytes(shape: str, seq_len: int, block: int | None) -> tuple[int, int]:
  """``(step bytes, accumulator bytes)`` of the baseline step for one sequence of ``seq_len`` at ``block``."""
  layers, d_model, heads, kv, vocab, mlp = SHAPES[shape]
  config = size_config(layers, d_model, heads, seq_len, 1, num_kv_heads=kv, vocab_size=vocab, mlp_dim=mlp)
  abstract = nnx.eval_shape(lambda: model_lib.create(config, seed=0))
  graphdef, params = nnx.split(abstract, nnx.Param)
  design = fixed_effects.make_design(layer_visible(abstract.spec, seq_len))
  step = steps.make_baseline_step(graphdef, design, {}, query_block=block)
  acc = jax.eval_shape(lambda: steps.init_accumulators(abstract.spec, seq_len, {}, AnalysisOptions().num_blocks,
                                                       num_groups=2))
  compiled = jax.jit(step, donate_argnums=1).lower(
      params, acc, jax.ShapeDtypeStruct((1, seq_len), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32)).compile()
  held = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(acc))
  return memory.step_bytes(compiled), held


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--seq_lens", default="1024,4096,8192,16384")
  p.add_argument("--shapes", default=",".join(SHAPES))
  a = p.parse_args()
  rows = []
  for shape in a.shapes.split(","):
    heads = SHAPES[shape][2]
    for seq_len in (int(x) for x in a.seq_lens.split(",")):
      within_cap = [b for b in memory.query_blocks(seq_len) if heads * b * seq_len * 4 <= memory.LOGITS_BYTES_CAP]
      block = within_cap[0] if within_cap else memory.query_blocks(seq_len)[-1]
      whole, held = _bytes(shape, seq_len, None)
      blocked = whole if block == seq_len else _bytes(shape, seq_len, block)[0]
      rows.append([shape, seq_len, f"{whole / memory.GiB:.2f}", block, f"{blocked / memory.GiB:.2f}",
                   f"{held / memory.GiB:.2f}", f"{heads * seq_len * seq_len * 4 / memory.GiB:.2f}"])
      print(rows[-1], flush=True)
  print(f"machine: {common.machine()}")
  print(common.markdown_table(["model", "seq_len", "step GiB, all T queries at once", "query block",
                               "step GiB at that block", "accumulators GiB", "one layer's [H, T, T] logits GiB"],
                              rows))


if __name__ == "__main__":
  main()
