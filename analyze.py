r"""Analyse a trained run, or compare analysed runs.

    python analyze.py --workdir=runs/rope [--step=N] [--out=runs/rope/analysis] \
        [--num_sequences=256] [--split=validation]
    python analyze.py --workdir=runs/rope --all_steps [--out=runs/rope/analysis_steps]  # every kept checkpoint
    python analyze.py --compare runs/rope runs/ntk runs/swa [--out=comparison]
    python analyze.py --hf=HF_DIR [--out=HF_DIR/analysis] [--seq_len=128]  # Llama / Mistral / Qwen2

Writes summary.json, stats.npz, PNG figures and report.md (see docs/analysis.md;
--hf: docs/interop.md; --all_steps and the emergence curves of --compare: docs/emergence.md).
"""

import os
import sys

# Set while the analysis hangs on 2 cores were unexplained (~10% of the tiny analysis step). Their cause,
# two LU solves at once on XLA's intra-op pool, is now avoided in the code itself and this flag did not
# prevent it (docs/analysis.md); kept as a precaution. Set before jax starts, unless the caller chose.
if "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_multi_thread_eigen=false".strip()

from absl import app, flags, logging  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUT = flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/analysis, or ./comparison).")
_NUM = flags.DEFINE_integer("num_sequences", 256, "Held-out sequences per BOS policy.")
_SPLIT = flags.DEFINE_string("split", "validation", "Data split the sequences come from.")
_SEQ_LEN = flags.DEFINE_integer("seq_len", None, "Tokens per sequence (default and maximum: the trained length).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Largest number of sequences per jitted pass (smaller where a batch "
                              "would exceed --memory_budget_gb).")
_BUDGET = flags.DEFINE_float("memory_budget_gb", None, "GiB one analysis step may allocate (default: half the memory "
                             "free at the start); the batch size is the largest that fits.")
_CLOSEDNESS = flags.DEFINE_integer("closedness_sequences", 4, "Sequences per sweep (the first ones) the position-0 "
                                   "closedness check reruns (docs/analysis.md).", lower_bound=1)
_NO_INTERVENTIONS = flags.DEFINE_bool("skip_interventions", False, "Skip the intervention sweep.")
_COMPARE = flags.DEFINE_bool("compare", False, "Compare the analysed runs given as arguments.")
_ALL_STEPS = flags.DEFINE_bool("all_steps", False, "Analyse every kept checkpoint into OUT/step_<N>/ and plot the "
                               "components against the step (OUT default: WORKDIR/analysis_steps).")
_HF = flags.DEFINE_string("hf", None, "A local Hugging Face checkpoint directory (Llama, Mistral or Qwen2 "
                          "safetensors with tokenizer.json) to analyse instead of a run; --seq_len defaults to "
                          "128 (or max_position_embeddings if shorter).")


def main(argv):
  logging.set_verbosity(logging.ERROR)
  if _COMPARE.value and _ALL_STEPS.value:
    sys.exit("error: --compare and --all_steps do not combine: run --all_steps on each run, then --compare them")
  if _COMPARE.value:
    from abspos_jax.analysis.compare import compare
    if len(argv) < 2:
      sys.exit("error: --compare needs run directories: python analyze.py --compare DIR1 DIR2 ...")
    out = _OUT.value or "comparison"
    compare(argv[1:], out)
    print(f"wrote {out}/comparison.md")
    return
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]} (did you mean --compare?)")
  from abspos_jax import distributed
  if distributed.requested():  # one of N processes (abspos_jax.launch, SLURM, a TPU pod)
    distributed.initialize()
  if _HF.value and (_WORKDIR.value or _STEP.value is not None):
    sys.exit("error: --hf analyses a Hugging Face checkpoint; it takes no --workdir or --step")
  if not _WORKDIR.value and not _HF.value:
    sys.exit("error: --workdir is required (or --hf=HF_DIR, or --compare DIR1 DIR2 ...)")
  if _ALL_STEPS.value and (_HF.value or _STEP.value is not None):
    sys.exit("error: --all_steps analyses every checkpoint of --workdir; it takes no --step or --hf")
  from abspos_jax.analysis import AnalysisOptions, analyze_all_steps, analyze_hf, analyze_run
  from abspos_jax.analysis.report import with_interval
  try:
    if _BATCH.value < 1:
      raise ValueError(f"--batch_size must be >= 1, got {_BATCH.value}")
    options = AnalysisOptions(batch_size=_BATCH.value, interventions=not _NO_INTERVENTIONS.value,
                              closedness_sequences=_CLOSEDNESS.value, memory_budget_gb=_BUDGET.value)
    options.validate()
    if _ALL_STEPS.value:
      records = analyze_all_steps(_WORKDIR.value, out=_OUT.value, num_sequences=_NUM.value, split=_SPLIT.value,
                                  seq_len=_SEQ_LEN.value, options=options)
      if distributed.is_writer():
        out = _OUT.value or f"{_WORKDIR.value}/analysis_steps"
        print(f"wrote {out}: step_<N>/ for steps {[r['step'] for r in records]}, steps.json, steps.png"
              + ("" if _OUT.value else f"; the latest also to {_WORKDIR.value}/analysis"))
      return
    if _HF.value:
      result = analyze_hf(_HF.value, out=_OUT.value, num_sequences=_NUM.value, split=_SPLIT.value,
                          seq_len=_SEQ_LEN.value, options=options)
    else:
      result = analyze_run(_WORKDIR.value, step=_STEP.value, out=_OUT.value, num_sequences=_NUM.value,
                           split=_SPLIT.value, seq_len=_SEQ_LEN.value, options=options)
  except (ValueError, FileNotFoundError, PermissionError) as e:
    sys.exit(f"error: {e}")
  out = _OUT.value or f"{_HF.value or _WORKDIR.value}/analysis"
  s = result.summary
  if distributed.is_writer():
    print(f"wrote {out}: summary.json, stats.npz, report.md and figures")
    pooled, early = s["components"]["pooled"], s["components"]["pooled_early"]
    share = lambda d: with_interval(d["residual_stream"], d.get("residual_stream_ci"))  # noqa: E731
    print(f"  residual-stream share (pooled / early): {share(pooled)} / {share(early)}; max sink score (held out) "
          f"{with_interval(s['sink_score_max'], s.get('sink_score_max_ci'))}")


if __name__ == "__main__":
  app.run(main)
