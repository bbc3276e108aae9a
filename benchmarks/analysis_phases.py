"""Where an analysis's time and memory go: resident memory over one ``analyze`` call, phase by phase.

    python -m benchmarks.analysis_phases [--shape=12x768x12 | --hf=CHECKPOINT] [--seq_len=1024]
                                         [--num_sequences=32] [--interventions]

``analyze`` on the random RoPE decoder of ``--shape`` (seeded) or a local
checkpoint (``--hf``: a Hugging Face directory or a GGUF file), on random
tokens under both BOS policies, interventions off unless ``--interventions``,
as ``benchmarks.analysis_scale --child=analyze`` runs it. A thread samples
the process's resident set (``/proc/self/statm``) every 0.1 s; the phases are
marked by wrapping the orchestrator's calls: the memory budget's
compilations, each sweep (named by its progress bar: each policy's pass and
each intervention's), the finalisation, the jackknife. Prints, per phase,
its start time and resident set and the largest resident set sampled until
the next mark; then the peak (``ru_maxrss``). Linux only (``/proc``).
"""

import argparse
import functools
import resource
import threading
import time

import jax
import numpy as np

from abspos_jax.analysis import core, orchestrator
from abspos_jax.analysis.estimators import effects
from abspos_jax.analysis.options import AnalysisOptions
from benchmarks.analysis_scale import _model

GiB = 2**30


def resident_gib() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * resource.getpagesize() / GiB


class Phases:
  """Resident-set samples and phase marks, both against the time since construction."""

  def __init__(self, every_s: float = 0.1):
    self.t0, self.samples, self.marks = time.perf_counter(), [], []
    threading.Thread(target=self._sample, args=(every_s,), daemon=True).start()

  def _sample(self, every_s: float) -> None:
    while True:
      self.samples.append((time.perf_counter() - self.t0, resident_gib()))
      time.sleep(every_s)

  def mark(self, name: str) -> None:
    self.marks.append((time.perf_counter() - self.t0, name, resident_gib()))

  def wrap(self, name: str, fn, label_arg: int | None = None):
    """``fn`` marked at its start and end; ``label_arg``: the positional argument that names the call."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      label = name if label_arg is None else f"{name} {args[label_arg]}"
      self.mark("begin " + label)
      out = jax.block_until_ready(fn(*args, **kwargs))
      self.mark("end " + label)
      return out
    return wrapped

  def table(self) -> list[list]:
    """``[time s, mark, resident GiB at the mark, largest sampled until the next mark]`` per mark."""
    ends = [m[0] for m in self.marks[1:]] + [float("inf")]
    rows = []
    for (t, name, rss), end in zip(self.marks, ends):
      seen = [r for s, r in self.samples if t <= s < end]
      rows.append([f"{t:.1f}", name, f"{rss:.2f}", f"{max(seen, default=rss):.2f}"])
    return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", default="12x768x12", help="layers x d_model x heads")
  p.add_argument("--seq_len", type=int, default=1024)
  p.add_argument("--num_sequences", type=int, default=32)
  p.add_argument("--hf", default="", help="a local checkpoint (HF directory or GGUF file) instead of --shape")
  p.add_argument("--interventions", action="store_true", help="run the interventions too")
  a = p.parse_args()
  phases = Phases()
  # The phases the orchestrator calls by these names (module attributes, so wrapping them reaches its calls).
  orchestrator._fit_batch_size = phases.wrap("memory budget (compilations)", orchestrator._fit_batch_size)
  orchestrator.sweep = phases.wrap("sweep", orchestrator.sweep, label_arg=5)
  effects.sweep = phases.wrap("sweep", effects.sweep, label_arg=5)
  core.finalize_baseline = phases.wrap("finalisation", core.finalize_baseline)
  core.jackknife_baseline = phases.wrap("jackknife", core.jackknife_baseline)
  m = _model(a.shape, a.seq_len, a.hf)
  tokens = np.random.default_rng(0).integers(0, 256, (a.num_sequences, a.seq_len)).astype(np.int32)
  phases.mark("model made")
  result = orchestrator.analyze(m, {"prepend": tokens, "none": np.roll(tokens, 1, axis=1)},
                                options=AnalysisOptions(interventions=a.interventions, progress=False))
  phases.mark("done")
  print(f"{a.hf or a.shape}, {a.seq_len} tokens x {a.num_sequences}: batch {result.summary['batch_size']}, query block "
        f"{result.summary['memory']['query_block']}, step {result.summary['memory']['step_gib']:.2f} GiB, "
        f"accumulators {result.summary['memory']['accumulators_gib']:.2f} GiB")
  print("| s | mark | resident GiB | largest until the next mark |\n|---|---|---|---|")
  for row in phases.table():
    print("| " + " | ".join(row) + " |")
  print(f"peak resident set (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
  main()
