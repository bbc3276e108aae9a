r"""Analyse a trained run, or compare analysed runs.

    python analyze.py --workdir=runs/rope [--step=N] [--out=runs/rope/analysis] \
        [--num_sequences=256] [--split=validation]
    python analyze.py --workdir=runs/rope --all_steps [--out=runs/rope/analysis_steps]  # every kept checkpoint
    python analyze.py --compare runs/rope runs/ntk runs/swa [--out=comparison]
    python analyze.py --hf=HF_DIR_OR_GGUF [--out=...] [--seq_len=128] [--bos=TOKEN] [--main_policy=prepend]
    python analyze.py ... [--data=stdlib_prose | --data=text_files --data_files=GLOB] [--rope_scale=ntk:4 | --window=W]

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
_HF = flags.DEFINE_string("hf", None, "A local checkpoint to analyse instead of a run: a Hugging Face directory "
                          "(Llama, Mistral or Qwen2 safetensors with tokenizer.json) or a GGUF file (or a directory "
                          "holding one); --seq_len defaults to 128 (or max_position_embeddings if shorter).")
_DATA = flags.DEFINE_string("data", None, "Texts to analyse: stdlib_text (code and prose), stdlib_prose (English "
                            "prose), text_files (with --data_files) or a prepared TFDS dataset (with --text_key). "
                            "Default: the run's own data; for --hf, stdlib_text.")
_DATA_FILES = flags.DEFINE_string("data_files", None, "--data=text_files: comma-separated paths or globs.")
_TEXT_KEY = flags.DEFINE_string("text_key", None, "--data=a TFDS dataset: the feature holding the text.")
_BOS = flags.DEFINE_string("bos", None, "--hf: the token (or id) put at position 0 under the prepend policy, "
                           "instead of the tokenizer's BOS (a base model's is its pretraining separator, e.g. "
                           "SmolLM2's <|endoftext|>).")
_EOS = flags.DEFINE_string("eos", None, "--hf: the token (or id) between documents, instead of the tokenizer's EOS.")
_MAIN_POLICY = flags.DEFINE_enum("main_policy", None, ["prepend", "none"], "--hf: the BOS policy of the headline "
                                 "numbers and interventions (default: prepend when the tokenizer adds a BOS).")
_IGNORE = flags.DEFINE_list("hf_ignore_fields", [], "--hf: config.json fields (or GGUF keys) to drop before "
                            "mapping, when you know they do not matter here; recorded in summary.json.")
_ROPE_SCALE = flags.DEFINE_string("rope_scale", None, "ntk:ALPHA: analyse the checkpoint with its RoPE base scaled "
                                  "NTK-aware (an inference-time variant; the unmodified loss is reported too).")
_WINDOW = flags.DEFINE_integer("window", None, "Analyse the checkpoint with a sliding window of W keys (query "
                               "included) on every layer: an inference-time variant.")


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
  hf_only = [f"--{f.name}" for f in (_BOS, _EOS, _MAIN_POLICY) if f.value is not None] + (
      ["--hf_ignore_fields"] if _IGNORE.value else [])
  if hf_only and not _HF.value:
    sys.exit(f"error: {', '.join(hf_only)} apply to --hf checkpoints (a run's BOS is its data.bos)")
  from abspos_jax.analysis import AnalysisOptions, analyze_all_steps, analyze_hf, analyze_run
  from abspos_jax.analysis.api import TextChoice, default_hf_out
  from abspos_jax.variants import Variant, parse_rope_scale
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
    texts = TextChoice(name=_DATA.value, files=_DATA_FILES.value, text_key=_TEXT_KEY.value)
    variant = Variant(ntk_alpha=parse_rope_scale(_ROPE_SCALE.value), window=_WINDOW.value)
    if _HF.value:
      result = analyze_hf(_HF.value, out=_OUT.value, num_sequences=_NUM.value, split=_SPLIT.value,
                          seq_len=_SEQ_LEN.value, texts=texts, bos=_BOS.value, eos=_EOS.value,
                          main_policy=_MAIN_POLICY.value, ignore_fields=tuple(_IGNORE.value), variant=variant,
                          options=options)
    else:
      result = analyze_run(_WORKDIR.value, step=_STEP.value, out=_OUT.value, num_sequences=_NUM.value,
                           split=_SPLIT.value, seq_len=_SEQ_LEN.value, texts=texts, variant=variant,
                           options=options)
  except (ValueError, FileNotFoundError, PermissionError) as e:
    sys.exit(f"error: {e}")
  out = _OUT.value or (default_hf_out(_HF.value) if _HF.value else f"{_WORKDIR.value}/analysis")
  s = result.summary
  if distributed.is_writer():
    print(f"wrote {out}: summary.json, stats.npz, report.md and figures")
    pooled, early = s["components"]["pooled"], s["components"]["pooled_early"]
    share = lambda d: with_interval(d["residual_stream"], d.get("residual_stream_ci"))  # noqa: E731
    print(f"  residual-stream share (pooled / early): {share(pooled)} / {share(early)}; max sink score (held out) "
          f"{with_interval(s['sink_score_max'], s.get('sink_score_max_ci'))}")


if __name__ == "__main__":
  app.run(main)
