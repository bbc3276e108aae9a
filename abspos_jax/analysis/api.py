"""``analyze_run``, ``analyze_all_steps`` and ``analyze_hf``: load a model, build its evaluation sequences,
analyse, write the outputs."""

import dataclasses
import os

import jax
import ml_collections

from abspos_jax import checkpoint, data, storage
from abspos_jax.data import builders
from abspos_jax.analysis import curves, outputs, schema
from abspos_jax.analysis.run import AnalysisOptions, AnalysisResult, analyze


def analyze_run(workdir: str, *, step: int | None = None, out: str | None = None, num_sequences: int = 256,
                split: str = "validation", seq_len: int | None = None,
                options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Analyse the checkpoint ``step`` (default: latest) of ``workdir``; write to ``out`` (default ``workdir/analysis``)."""
  if num_sequences < 2:
    raise ValueError(f"--num_sequences must be >= 2 (the held-out estimators need two halves), got {num_sequences}")
  config, model, step = checkpoint.load_model(workdir, step)
  out = out or storage.join(workdir, "analysis")
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
  meta = {"workdir": storage.absolute(workdir), "step": int(step), "data": config.data.name, "split": split,
          "options": dataclasses.asdict(options)}
  outputs.write(out, result.summary, result.stats, meta)
  return result


def _previous(path: str, workdir: str, step: int, num_sequences: int, split: str, seq_len: int,
              options: AnalysisOptions) -> dict | None:
  """The ``summary.json`` at ``path`` if it is this step's analysis with these settings and estimators, else None."""
  if not storage.path(path).exists():
    return None
  s = storage.read_json(path)
  if s.get("estimators") != schema.ESTIMATORS:  # an older analysis: its keys and numbers differ
    return None
  m = s.get("meta", {})
  same_options = {**m.get("options", {}), "progress": None} == {**dataclasses.asdict(options), "progress": None}
  return s if (m.get("workdir"), m.get("step"), m.get("split"), s.get("num_sequences"), s.get("seq_len"),
               same_options) == (storage.absolute(workdir), step, split, num_sequences, seq_len, True) else None


def analyze_all_steps(workdir: str, *, out: str | None = None, num_sequences: int = 256, split: str = "validation",
                      seq_len: int | None = None, options: AnalysisOptions = AnalysisOptions()) -> list[dict]:
  """Analyse every kept checkpoint of ``workdir``; returns one ``curves.step_record`` per step.

  Writes ``OUT/step_<N>/`` (the full analysis of step N, as ``analyze_run``
  writes it) for every checkpoint, then ``OUT/steps.json`` and
  ``OUT/steps.png`` (components, leakage, sinks and, with interventions, the
  BOS-replace removed fraction against the step). ``OUT`` defaults to
  ``workdir/analysis_steps``; then the latest step's analysis is also copied
  to ``workdir/analysis``, where ``--compare`` reads it. A step whose
  ``step_<N>/summary.json`` holds an analysis with the same settings is read
  back, not recomputed, so a rerun after more training analyses only the new
  checkpoints.
  """
  config, steps = checkpoint.kept_steps(workdir)
  root = out or storage.join(workdir, "analysis_steps")
  resolved_len = seq_len or config.data.seq_len
  records = []
  for step in steps:
    step_out = storage.join(root, f"step_{step}")
    summary = _previous(storage.join(step_out, outputs.MARKER), workdir, step, num_sequences, split, resolved_len,
                        options)
    if summary is None:
      summary = analyze_run(workdir, step=step, out=step_out, num_sequences=num_sequences, split=split,
                            seq_len=seq_len, options=options).summary
    records.append(curves.step_record(step, summary, config.train.batch_size * config.data.seq_len))
  if jax.process_index() == 0:
    curves.write_steps(root, records, workdir)
    if out is None:
      with storage.directory(storage.join(workdir, "analysis"), ".analysis-", marker=outputs.MARKER) as tmp:
        storage.copy_tree(storage.join(root, f"step_{steps[-1]}"), tmp)
  return records


def analyze_hf(hf_dir: str, *, out: str | None = None, num_sequences: int = 256, split: str = "validation",
               seq_len: int | None = None, data_cfg: ml_collections.ConfigDict | None = None,
               bos_replace_token: int | None = None,
               options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Analyse a local Llama / Mistral / Qwen2 checkpoint ``hf_dir``; write to ``out`` (default ``hf_dir/analysis``).

  The texts are the documents of ``data_cfg`` (default: the offline
  ``stdlib_text`` data) tokenised with the checkpoint's own ``tokenizer.json``,
  documents separated by its EOS. Its BOS convention (``interop.hf.bos_convention``)
  picks the main policy: ``prepend`` (its BOS at position 0) when its tokenizer
  adds one, else ``none``; the other policy is analysed too when a BOS id is
  known. ``bos_replace_token`` (default: the token the tokenizer gives ``"\\n"``,
  else ``options.bos_replace_token``) is the "another token" of ``bos_replace``.
  ``seq_len`` defaults to 128 tokens, or ``max_position_embeddings`` when that
  is shorter. Needs the ``.[hf]`` extra; refuses unsupported checkpoints naming
  the field.
  """
  from abspos_jax.interop import hf

  if num_sequences < 2:
    raise ValueError(f"--num_sequences must be >= 2 (the held-out estimators need two halves), got {num_sequences}")
  if split not in ("train", "validation"):
    raise ValueError(f"--split must be train or validation, got {split!r}")
  hf_config = hf.read_config(hf_dir)
  if seq_len is None:
    seq_len = min(128, hf_config.get("max_position_embeddings") or 128)
  if seq_len < 2:
    raise ValueError(f"--seq_len must be >= 2, got {seq_len}")
  config = hf.config_from_hf(hf_config, seq_len=seq_len, where=os.path.join(hf_dir, hf.CONFIG))
  tok = hf.load_tokenizer(hf_dir)  # before the weights: a missing tokenizer is refused cheaply
  out = out or os.path.join(hf_dir, "analysis")
  outputs.check_writable(out)
  model = hf.params_from_hf(hf.load_safetensors(hf_dir), config, where=hf_dir)
  conv = hf.bos_convention(hf_dir, tok, hf_config)
  if data_cfg is None:
    data_cfg = config.data  # base defaults: stdlib_text
  prepared = builders.prepare_dataset(data_cfg)
  source = prepared.source(split)
  texts = (bytes(source[i][prepared.text_key]).decode("utf-8", errors="replace") for i in range(len(source)))
  stream = hf.token_stream(tok, texts, conv.eos_id)
  sequences = hf.analysis_sequences(stream, num_sequences=num_sequences, seq_len=seq_len, conv=conv,
                                    vocab_size=model.spec.vocab_size)
  if bos_replace_token is None:
    newline = tok.encode("\n", add_special_tokens=False).ids
    bos_replace_token = newline[0] if len(newline) == 1 else options.bos_replace_token
  if not 0 <= bos_replace_token < model.spec.vocab_size:
    raise ValueError(f"bos_replace_token {bos_replace_token} is not a token id of this model "
                     f"(vocab_size {model.spec.vocab_size})")
  options = dataclasses.replace(options, bos_replace_token=int(bos_replace_token))
  main = "prepend" if conv.adds else "none"
  result = analyze(model, sequences, main=main, options=options)
  meta = {"workdir": os.path.abspath(hf_dir), "source": "hf", "model_type": hf_config.get("model_type"),
          "position": config.model.position, "data": data_cfg.name, "split": split,
          "tokenizer": {"bos_id": conv.bos_id, "adds_bos": conv.adds, "eos_id": conv.eos_id, "from": conv.source,
                        "stream_tokens": int(len(stream))},
          "options": dataclasses.asdict(options)}
  outputs.write(out, result.summary, result.stats, meta)
  return result
