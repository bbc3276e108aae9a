"""What an end-to-end ``analyze`` compiles: XLA programs, their compile seconds, and the wall time around them.

    python -m benchmarks.analysis_compiles [--shape=2x64x4] [--seq_len=64] [--num_sequences=16] [--batch_size=8]

One ``analyze`` of a randomly initialised RoPE decoder (``--shape`` layers x
d_model x heads) on both BOS policies with the interventions, in this fresh
process, without a persistent compilation cache: every XLA compilation
(jax's ``/jax/core/compile/backend_compile_duration`` event) is counted and
timed, per function name. Compilation is a fixed cost per shape, paid again
by every process (a test, a sweep's analysis of each run), so it is what a
short analysis mostly waits for. To compare two versions of the code, run
this file with ``PYTHONPATH`` at each tree, one after the other on an idle
machine.
"""

import argparse
import collections
import json
import time

import jax
import numpy as np
from jax import monitoring

from abspos_jax import model as model_lib
from abspos_jax.config import base_config
from abspos_jax.analysis import AnalysisOptions, analyze
from abspos_jax.data import BOS_ID

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--shape", default="2x64x4", help="layers x d_model x heads")
  parser.add_argument("--seq_len", type=int, default=64)
  parser.add_argument("--num_sequences", type=int, default=16)
  parser.add_argument("--batch_size", type=int, default=8)
  args = parser.parse_args()
  jax.config.update("jax_compilation_cache_dir", None)

  compiles: dict[str, list[float]] = collections.defaultdict(list)

  def listen(event: str, seconds: float, **kwargs) -> None:
    if event == COMPILE_EVENT:
      compiles[kwargs.get("fun_name", "?")].append(seconds)

  monitoring.register_event_duration_secs_listener(listen)
  config = base_config()
  layers, d_model, heads = (int(x) for x in args.shape.split("x"))
  config.model.update(position="rope", num_layers=layers, d_model=d_model, num_heads=heads)
  config.data.seq_len = args.seq_len
  model = model_lib.create(config, seed=0)
  none = np.random.default_rng(0).integers(0, 256, (args.num_sequences, args.seq_len)).astype(np.int32)
  prepend = none.copy()
  prepend[:, 0] = BOS_ID
  start = time.perf_counter()
  analyze(model, {"prepend": prepend, "none": none},
          options=AnalysisOptions(batch_size=args.batch_size, progress=False))
  wall = time.perf_counter() - start
  rows = sorted(((sum(s), len(s), name) for name, s in compiles.items()), reverse=True)
  print(json.dumps({"shape": args.shape, "seq_len": args.seq_len, "num_sequences": args.num_sequences,
                    "batch_size": args.batch_size, "wall_s": round(wall, 2),
                    "compilations": sum(n for _, n, _ in rows),
                    "compile_s": round(sum(s for s, _, _ in rows), 2),
                    "top": [{"fun": name, "count": n, "s": round(s, 2)} for s, n, name in rows[:6]]}))


if __name__ == "__main__":
  main()
