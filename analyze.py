r"""Analyse a trained run, or compare analysed runs.

    python analyze.py --workdir=runs/rope [--step=N] [--out=runs/rope/analysis] \
        [--num_sequences=256] [--split=validation]
    python analyze.py --workdir=runs/rope --all_steps [--out=runs/rope/analysis_steps]  # every kept checkpoint
    python analyze.py --compare runs/rope runs/ntk runs/swa [--out=comparison]
    python analyze.py --hf=HF_DIR_OR_GGUF [--out=...] [--seq_len=128] [--bos=TOKEN] [--main_policy=prepend]
    python analyze.py --hf=... --seq_lens=128,512,2048,8192:8 [--out=...]  # against context length (or --workdir)
    python analyze.py ... [--data=stdlib_prose | --data=text_files --data_files=GLOB] [--rope_scale=ntk:4 | --window=W]

Writes summary.json, stats.npz, PNG figures and report.md (see docs/analysis.md;
--hf: docs/interop.md; --all_steps and the emergence curves of --compare: docs/emergence.md).
"""

import os
import sys

from absl import app, flags, logging

from abspos_jax.analysis import options as options_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory written by train.py.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_OUT = flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/analysis, or ./comparison).")
_COMPARE = flags.DEFINE_bool("compare", False, "Compare the analysed runs given as arguments.")
_ALL_STEPS = flags.DEFINE_bool("all_steps", False, "Analyse every kept checkpoint into OUT/step_<N>/ and plot the "
                               "components against the step (OUT default: WORKDIR/analysis_steps).")
_HF = flags.DEFINE_string("hf", None, "A local checkpoint to analyse instead of a run: a Hugging Face directory "
                          "(Llama, Mistral or Qwen2 safetensors with tokenizer.json) or a GGUF file (or a directory "
                          "holding one); --seq_len defaults to 128 (or max_position_embeddings if shorter).")
_SEQ_LENS = flags.DEFINE_list("seq_lens", [], "Analyse at each of these lengths into OUT/seq_len_<T>/ and plot the "
                              "components against the context length (OUT default: WORKDIR/analysis_lengths, or "
                              "--hf's default output with _lengths). T:N analyses N sequences at T tokens (default "
                              "--num_sequences). A rerun of the same command keeps the lengths already done.")
# The analysis options (what to analyse, texts, position 0, variants, batch): declared once, in options.py.
OPTS = options_lib.define_flags()
# Options --all_steps does not take: it analyses each checkpoint on the run's own texts, unmodified.
_NOT_ALL_STEPS = ("data", "data_files", "text_key", "rope_scale", "window")


def _check_sources() -> None:
  """Exit with a message when the flags name no analysis, or two that do not combine."""
  if _HF.value and (_WORKDIR.value or _STEP.value is not None):
    sys.exit("error: --hf analyses a Hugging Face checkpoint; it takes no --workdir or --step")
  if not _WORKDIR.value and not _HF.value:
    sys.exit("error: --workdir is required (or --hf=HF_DIR, or --compare DIR1 DIR2 ...)")
  if _ALL_STEPS.value and (_HF.value or _STEP.value is not None):
    sys.exit("error: --all_steps analyses every checkpoint of --workdir; it takes no --step or --hf")
  if _ALL_STEPS.value and any(OPTS[name].value is not None for name in _NOT_ALL_STEPS):
    sys.exit(f"error: --all_steps takes none of {', '.join('--' + n for n in _NOT_ALL_STEPS)}: it analyses every "
             "checkpoint on the run's own texts, unmodified")
  if _SEQ_LENS.value and (_ALL_STEPS.value or OPTS["seq_len"].value is not None):
    sys.exit("error: --seq_lens analyses one checkpoint at each length; it takes no --seq_len or --all_steps")
  hf_only = [f"--{f.name}" for f in options_lib.FLAGS
             if f.scope == "hf" and OPTS[f.name].value not in (None, [])]
  if hf_only and not _HF.value:
    sys.exit(f"error: {', '.join(hf_only)} apply to --hf checkpoints (a run's BOS is its data.bos)")


def _source_label(o: dict) -> str:
  """How lengths.png and report.md name what was analysed: the checkpoint's file or directory name, then the texts
  and the variant when given (``SmolLM2-135M-Instruct.Q4_1.gguf, data stdlib_prose, rope_scale ntk:2``)."""
  name = os.path.basename(os.path.normpath(_HF.value or _WORKDIR.value))
  return ", ".join([name] + [f"{k} {o[k]}" for k in ("data", "rope_scale", "window") if o[k] is not None])


def _print_headline(out: str, s: dict) -> None:
  from abspos_jax.analysis.outputs import schema
  from abspos_jax.analysis.outputs.report import with_interval
  print(f"wrote {out}: summary.json, stats.npz, report.md and figures")
  share = lambda path: with_interval(schema.get(s, path + ("residual_stream",)),  # noqa: E731
                                     schema.interval(s, path + ("residual_stream",)))
  best = with_interval(schema.get(s, schema.SINK_SCORE_MAX), schema.interval(s, schema.SINK_SCORE_MAX))
  print(f"  residual-stream share (pooled / early): {share(schema.POOLED)} / {share(schema.POOLED_EARLY)}; max sink "
        f"score (held out) {best}")


def main(argv):
  logging.set_verbosity(logging.ERROR)
  if _COMPARE.value and _ALL_STEPS.value:
    sys.exit("error: --compare and --all_steps do not combine: run --all_steps on each run, then --compare them")
  if _COMPARE.value:
    from abspos_jax.analysis.outputs.compare import compare
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
  _check_sources()
  from abspos_jax.analysis import analyze_all_steps, analyze_hf, analyze_lengths, analyze_run
  from abspos_jax.analysis.api import TextChoice, default_hf_out
  from abspos_jax.analysis.outputs.lengths import parse_seq_lens
  from abspos_jax.variants import Variant, parse_rope_scale
  try:
    o = {name: holder.value for name, holder in OPTS.items()}
    options = options_lib.AnalysisOptions(batch_size=o["batch_size"], interventions=not o["skip_interventions"],
                                          closedness_sequences=o["closedness_sequences"],
                                          memory_budget_gb=o["memory_budget_gb"], query_block=o["query_block"])
    options.validate()
    common = dict(out=_OUT.value, num_sequences=o["num_sequences"], split=o["split"], seq_len=o["seq_len"],
                  options=options)
    if _ALL_STEPS.value:
      records = analyze_all_steps(_WORKDIR.value, **common)
      if distributed.is_writer():
        out = _OUT.value or f"{_WORKDIR.value}/analysis_steps"
        print(f"wrote {out}: step_<N>/ for steps {[r['step'] for r in records]}, steps.json, steps.png"
              + ("" if _OUT.value else f"; the latest also to {_WORKDIR.value}/analysis"))
      return
    common.update(texts=TextChoice(name=o["data"], files=o["data_files"], text_key=o["text_key"]),
                  variant=Variant(ntk_alpha=parse_rope_scale(o["rope_scale"]), window=o["window"]))
    if _HF.value:
      def one(**kw):
        return analyze_hf(_HF.value, bos=o["bos"], eos=o["eos"], main_policy=o["main_policy"],
                          ignore_fields=tuple(o["hf_ignore_fields"]), **{**common, **kw})
    else:
      def one(**kw):
        return analyze_run(_WORKDIR.value, step=_STEP.value, **{**common, **kw})
    if _SEQ_LENS.value:
      out = _OUT.value or (f"{default_hf_out(_HF.value)}_lengths" if _HF.value
                           else f"{_WORKDIR.value}/analysis_lengths")
      pairs = parse_seq_lens(_SEQ_LENS.value)
      analyze_lengths(pairs, out, lambda t, n, where: one(seq_len=t, out=where, **({} if n is None else
                                                                                  {"num_sequences": n})),
                      _source_label(o), request={"hf": _HF.value, "workdir": _WORKDIR.value, "step": _STEP.value,
                                                 **o})
      if distributed.is_writer():
        print(f"wrote {out}: seq_len_<T>/ for T in {[t for t, _ in pairs]}, lengths.json, lengths.png, report.md")
      return
    result = one()
  except (ValueError, FileNotFoundError, PermissionError) as e:
    sys.exit(f"error: {e}")
  if distributed.is_writer():
    _print_headline(_OUT.value or (default_hf_out(_HF.value) if _HF.value else f"{_WORKDIR.value}/analysis"),
                    result.summary)


if __name__ == "__main__":
  app.run(main)
