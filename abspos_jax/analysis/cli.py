"""``analyze_run``: restore a run, build its evaluation sequences, analyse, write the outputs."""

import dataclasses
import os

from abspos_jax import checkpoint, data
from abspos_jax.analysis import outputs
from abspos_jax.analysis.run import AnalysisOptions, AnalysisResult, analyze


def analyze_run(workdir: str, *, step: int | None = None, out: str | None = None, num_sequences: int = 256,
                split: str = "validation", seq_len: int | None = None,
                options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Analyse the checkpoint ``step`` (default: latest) of ``workdir``; write to ``out`` (default ``workdir/analysis``)."""
  if num_sequences < 2:
    raise ValueError(f"--num_sequences must be >= 2 (the held-out estimators need two halves), got {num_sequences}")
  config, model, step = checkpoint.load_model(workdir, step)
  out = out or os.path.join(workdir, "analysis")
  outputs.check_writable(out)
  trained = config.data.seq_len
  seq_len = seq_len or trained
  if seq_len > trained:
    raise ValueError(f"--seq_len {seq_len} is longer than the {trained} tokens the model was trained on "
                     f"(data.seq_len of {workdir}/config.json)")
  sequences = {}
  for policy in ("prepend", "none"):
    seqs = data.eval_sequences(config.data, num_sequences=num_sequences, split=split, bos=policy)
    sequences[policy] = seqs[:, :seq_len]  # the model's inputs
  result = analyze(model, sequences, main=config.data.bos, options=options)
  meta = {"workdir": os.path.abspath(workdir), "step": int(step), "data": config.data.name, "split": split,
          "options": dataclasses.asdict(options)}
  outputs.write(out, result.summary, result.stats, meta)
  return result
