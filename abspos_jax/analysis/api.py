"""``analyze_run``, ``analyze_all_steps``, ``analyze_hf`` and ``analyze_lengths``: load a model, build its
evaluation sequences, analyse, write the files."""

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import checkpoint, data, provenance, storage, variants
from abspos_jax.data import builders
from abspos_jax.analysis.outputs import curves, lengths as lengths_lib, schema, writer
from abspos_jax.analysis.options import NUM_SEQUENCES, AnalysisOptions
from abspos_jax.analysis.orchestrator import AnalysisResult, analyze
from abspos_jax.analysis.passes import memory, steps
from abspos_jax.config import BOS_POLICIES
from abspos_jax.hooks import Hooks
from abspos_jax.loss import chunked_lm_loss


@dataclasses.dataclass(frozen=True)
class TextChoice:
  """Which texts an analysis reads: a dataset of the training side (``data.name``: ``stdlib_text``,
  ``stdlib_prose``, ``text_files`` with ``files``, or a prepared TFDS dataset with ``text_key``); None
  fields keep the run's own (for ``--hf``: ``stdlib_text``)."""

  name: str | None = None
  files: str | None = None
  text_key: str | None = None

  def data_config(self, data: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """``data`` with this choice applied, validated (an empty ``files`` is refused by name)."""
    d = ml_collections.ConfigDict(data.to_dict())
    if self.name:
      d.name = self.name
    if self.files is not None:
      d.files = self.files
    if self.text_key:
      d.text_key = self.text_key
    if self.files and d.name != "text_files":
      raise ValueError(f"--data_files is read with --data=text_files only (got --data={d.name})")
    if d.name == "text_files" and not d.files.strip():
      raise ValueError("--data=text_files needs --data_files=PATH[,GLOB...]: the texts to analyse")
    return d


def _check_request(num_sequences: int, split: str, main_policy: str | None = None) -> None:
  """Refuse, naming the flag, what no analysis can do (before anything is loaded)."""
  if num_sequences < 2:
    raise ValueError(f"--num_sequences must be >= 2 (the held-out estimators need two halves), got {num_sequences}")
  if split not in ("train", "validation"):
    raise ValueError(f"--split must be train or validation, got {split!r}")
  if main_policy not in (None, *BOS_POLICIES):
    raise ValueError(f"--main_policy must be one of {', '.join(BOS_POLICIES)}, got {main_policy!r}")


def _data_meta(d: ml_collections.ConfigDict, split: str) -> dict:
  out = {"name": d.name, "split": split}
  if d.name == "text_files":
    out["files"] = d.files
  elif d.name not in builders.BUILTIN_NAMES:
    out["text_key"] = d.text_key
  return out


def _unmodified_loss(model, sequences: np.ndarray, batch_size: int, query_block: int | None = None) -> float:
  """Mean next-token loss of ``model`` on ``sequences [N, T]`` (the analysis' own loss, without its pass).

  Computed as the analysis computes its own: the attention in blocks of
  queries (``query_block``, else the largest of :func:`memory.query_blocks`)
  and the logits in chunks (``steps.LOSS_CHUNK``), so that no ``[T, T]``
  logits or ``[T, V]`` logits are whole: at 16,384 tokens SmolLM2's would be
  9.7 GB per layer and 3.2 GB per sequence.
  """
  graphdef, params = nnx.split(model, nnx.Param)
  seq_len = sequences.shape[1]
  block = memory.query_blocks(seq_len, query_block)[0]

  def loss_of(p, t):
    m = nnx.merge(graphdef, p)
    features = m.features(t, hooks=Hooks(query_block=None if block == seq_len else block))
    return chunked_lm_loss(m.logits, features[:, :-1], t[:, 1:], steps.LOSS_CHUNK)

  loss = jax.jit(loss_of)
  total = 0.0
  for i in range(0, len(sequences), batch_size):
    batch = sequences[i:i + batch_size]
    total += float(loss(params, jnp.asarray(batch))) * len(batch)
  return total / len(sequences)


def _with_variant(model, config, variant: variants.Variant, sequences: dict, main: str,
                  options: AnalysisOptions) -> tuple:
  """``(model, config, variant meta)``: the variant's model of the same weights, and the unmodified model's
  loss on the main policy's sequences (so that the damage the variant does is visible)."""
  if not variant:
    return model, config, None
  vconfig = variants.apply(config, variant)
  meta = {**variant.describe(), "loss_unmodified": _unmodified_loss(model, sequences[main], options.batch_size,
                                                                    options.query_block)}
  return variants.rebuild(model, vconfig), vconfig, meta


def analyze_run(workdir: str, *, step: int | None = None, out: str | None = None, num_sequences: int = NUM_SEQUENCES,
                split: str = "validation", seq_len: int | None = None, texts: TextChoice = TextChoice(),
                variant: variants.Variant = variants.Variant(),
                options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Analyse the checkpoint ``step`` (default: latest) of ``workdir``; write to ``out`` (default ``workdir/analysis``).

  The sequences come from the run's own data, or from ``texts`` (tokenised
  with the run's tokenizer); ``variant`` applies NTK scaling or a window to the
  trained weights (:mod:`abspos_jax.variants`).
  """
  _check_request(num_sequences, split)
  config, model, step = checkpoint.load_model(workdir, step)
  data_cfg = texts.data_config(config.data)
  out = out or storage.join(workdir, "analysis")
  writer.check_writable(out)
  trained = config.data.seq_len
  seq_len = seq_len or trained
  if seq_len > trained:
    raise ValueError(f"--seq_len {seq_len} is longer than the {trained} tokens the model was trained on "
                     f"(data.seq_len of {workdir}/config.json)")
  sequences = {}
  for policy in BOS_POLICIES:
    seqs = data.eval_sequences(data_cfg, num_sequences=num_sequences, split=split, bos=policy)
    sequences[policy] = seqs[:, :seq_len]  # the model's inputs
  main = config.data.bos
  model, config, variant_meta = _with_variant(model, config, variant, sequences, main, options)
  result = analyze(model, sequences, main=main, options=options)
  meta = {"workdir": storage.absolute(workdir), "step": int(step), "data": data_cfg.name,
          "texts": _data_meta(data_cfg, split), "split": split, "variant": variant_meta,
          "options": dataclasses.asdict(options), "provenance": provenance.analysis(workdir)}
  writer.write(out, result.summary, result.stats, meta)
  return result


def _previous(path: str, workdir: str, step: int, num_sequences: int, split: str, seq_len: int,
              options: AnalysisOptions) -> dict | None:
  """The ``summary.json`` at ``path`` if it is this step's analysis with these settings, estimators and code,
  else None."""
  if not storage.path(path).exists():
    return None
  s = storage.read_json(path)
  if s.get("estimators") != schema.ESTIMATORS:  # an older analysis: its keys and numbers differ
    return None
  m = s.get("meta", {})
  same_options = {**m.get("options", {}), "progress": None} == {**dataclasses.asdict(options), "progress": None}
  same_code = provenance.analysed_here(m)
  return s if (m.get("workdir"), m.get("step"), m.get("split"), s.get("num_sequences"), s.get("seq_len"),
               same_options, same_code) == (storage.absolute(workdir), step, split, num_sequences, seq_len, True,
                                            True) else None


def analyze_all_steps(workdir: str, *, out: str | None = None, num_sequences: int = NUM_SEQUENCES,
                      split: str = "validation", seq_len: int | None = None,
                      options: AnalysisOptions = AnalysisOptions()) -> list[dict]:
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
    summary = _previous(storage.join(step_out, writer.MARKER), workdir, step, num_sequences, split, resolved_len,
                        options)
    if summary is None:
      summary = analyze_run(workdir, step=step, out=step_out, num_sequences=num_sequences, split=split,
                            seq_len=seq_len, options=options).summary
    records.append(curves.step_record(step, summary, config.train.batch_size * config.data.seq_len))
  if jax.process_index() == 0:
    curves.write_steps(root, records, workdir)
    if out is None:
      with storage.directory(storage.join(workdir, "analysis"), ".analysis-", marker=writer.MARKER) as tmp:
        storage.copy_tree(storage.join(root, f"step_{steps[-1]}"), tmp)
  return records


def analyze_lengths(seq_lens: Sequence[tuple[int, int | None]], out: str,
                    analyse: Callable[[int, int | None, str], AnalysisResult], source: str,
                    request: Mapping | None = None) -> list[dict]:
  """Analyse one checkpoint at each length; returns one ``lengths.length_record`` per length.

  ``seq_lens`` holds ``(T, N)`` pairs (:func:`lengths.parse_seq_lens`): N
  sequences at T tokens, None for the caller's default (long contexts cost
  more per sequence). ``analyse(seq_len, num_sequences, out)`` runs and
  writes the analysis at one length (``analyze_run`` or ``analyze_hf`` with
  everything else fixed) into ``OUT/seq_len_<T>/``; then ``OUT/lengths.json``,
  ``OUT/lengths.png`` (each leakage component, the leakage share, the sinks
  and the slope of ``log Z`` against the context length, with their
  intervals) and ``OUT/report.md`` (the same as a table). ``source`` names the
  checkpoint in the figure and the report. The longest lengths run in blocks
  of queries within the memory budget (``AnalysisOptions.query_block``).

  ``request`` (what the caller was asked for besides the lengths: the CLI's
  flags) is written to ``OUT/request.json`` first. A rerun with the same
  request keeps each length whose ``summary.json`` is already there, for the
  same T and N and by the same code (:func:`lengths.kept`), so a sweep killed
  at its longest length resumes there.
  """
  pairs = lengths_lib.check_seq_lens(seq_lens)
  request = {"source": source, **(request or {})}
  request_path = storage.join(out, "request.json")
  same_request = storage.path(request_path).exists() and storage.read_json(request_path) == request
  if jax.process_count() > 1:  # every process reads the old request before process 0 replaces it
    multihost_utils.sync_global_devices("analyze_lengths: request read")
  if jax.process_index() == 0:
    storage.makedirs(out)
    storage.write_json(request_path, request)
  summaries = {}
  for t, n in pairs:
    where = storage.join(out, f"seq_len_{t}")
    summaries[t] = (same_request and lengths_lib.kept(storage.join(where, writer.MARKER), t, n)) or \
        analyse(t, n, where).summary
  records = [lengths_lib.length_record(t, s) for t, s in summaries.items()]
  if jax.process_index() == 0:
    lengths_lib.write_lengths(out, records, source)
  return records


def _token(tok, tid: int | None) -> str | None:
  return None if tid is None else tok.id_to_token(tid)


def default_hf_out(path: str) -> str:
  """Where ``analyze_hf`` writes by default: ``PATH/analysis`` for a directory, ``STEM-analysis`` beside a file."""
  return f"{os.path.splitext(path)[0]}-analysis" if os.path.isfile(path) else os.path.join(path, "analysis")


def _token_stream(hf, tok, conv, data_cfg: ml_collections.ConfigDict, split: str) -> np.ndarray:
  """The documents of ``split`` tokenised with ``tok``, separated by ``conv``'s EOS; an empty one is refused."""
  prepared = builders.prepare_dataset(data_cfg)
  source = prepared.source(split)
  documents = (bytes(source[i][prepared.text_key]).decode("utf-8", errors="replace") for i in range(len(source)))
  stream = hf.token_stream(tok, documents, conv.eos_id)
  if not len(stream):
    raise ValueError(f"the {split} split of data {data_cfg.name!r} holds no text")
  return stream


def _replacement_token(tok, token: int | None, options: AnalysisOptions, vocab_size: int) -> int:
  """``bos_replace``'s "another token": ``token``, else the tokenizer's newline when it is one token."""
  if token is None:
    newline = tok.encode("\n", add_special_tokens=False).ids
    token = newline[0] if len(newline) == 1 else options.bos_replace_token
  if not 0 <= token < vocab_size:
    raise ValueError(f"bos_replace_token {token} is not a token id of this model (vocab_size {vocab_size})")
  return int(token)


def analyze_hf(path: str, *, out: str | None = None, num_sequences: int = NUM_SEQUENCES, split: str = "validation",
               seq_len: int | None = None, texts: TextChoice = TextChoice(),
               data_cfg: ml_collections.ConfigDict | None = None, bos: str | None = None,
               eos: str | None = None, main_policy: str | None = None, ignore_fields: tuple[str, ...] = (),
               variant: variants.Variant = variants.Variant(), bos_replace_token: int | None = None,
               options: AnalysisOptions = AnalysisOptions()) -> AnalysisResult:
  """Analyse a local Llama / Mistral / Qwen2 checkpoint: a Hugging Face directory or a GGUF file.

  Writes to ``out`` (default: :func:`default_hf_out`).
  The texts (``texts``, default the offline ``stdlib_text``; or a whole
  ``data`` config section ``data_cfg``, e.g. a run's) are tokenised
  with the checkpoint's own tokenizer, documents separated by its EOS (or
  ``eos``). Position 0: the checkpoint's BOS convention
  (``interop.hf.bos_convention``) picks the main policy, ``prepend`` when its
  tokenizer adds a BOS, else ``none``; ``bos`` (a token or an id) replaces its
  BOS token and ``main_policy`` the choice. The other policy is analysed too
  when a BOS id is known. ``bos_replace_token`` (default: the token the
  tokenizer gives ``"\\n"``, else ``options.bos_replace_token``) is the "another
  token" of ``bos_replace``. ``seq_len`` defaults to 128 tokens, or
  ``max_position_embeddings`` when shorter. ``ignore_fields``: the config
  fields (or GGUF keys) to drop before mapping, recorded. ``variant``: NTK
  scaling or a window applied to the weights (:mod:`abspos_jax.variants`).
  Needs the ``.[hf]`` extra; refuses unsupported checkpoints naming the field.
  """
  from abspos_jax.interop import hf

  _check_request(num_sequences, split, main_policy)
  ckpt = hf.Checkpoint(path)
  if seq_len is None:
    seq_len = min(128, ckpt.hf_config.get("max_position_embeddings") or 128)
  if seq_len < 2:
    raise ValueError(f"--seq_len must be >= 2, got {seq_len}")
  config = ckpt.config(seq_len, ignore_fields, context_scale=variant.context_scale())
  tok, conv = ckpt.tokenizer()  # before the weights: a missing tokenizer is refused cheaply
  conv = hf.choose_special_tokens(tok, conv, bos=bos, eos=eos, main_policy=main_policy,
                                  vocab_size=config.model.vocab_size)
  data_cfg = texts.data_config(data_cfg or config.data)  # base defaults: stdlib_text
  out = out or default_hf_out(path)
  writer.check_writable(out)
  stream = _token_stream(hf, tok, conv, data_cfg, split)
  sequences = hf.analysis_sequences(stream, num_sequences=num_sequences, seq_len=seq_len, conv=conv,
                                    vocab_size=config.model.vocab_size)
  model = ckpt.model(config)
  options = dataclasses.replace(options, bos_replace_token=_replacement_token(tok, bos_replace_token, options,
                                                                              model.spec.vocab_size))
  main = main_policy or ("prepend" if conv.adds else "none")
  model, config, variant_meta = _with_variant(model, config, variant, sequences, main, options)
  result = analyze(model, sequences, main=main, options=options)
  meta = {"workdir": os.path.abspath(path), "source": "hf", "model_type": ckpt.hf_config.get("model_type"),
          "position": config.model.position, "checkpoint": ckpt.describe(), "hf_config": ckpt.hf_config,
          "hf_ignore_fields": list(ignore_fields), "data": data_cfg.name, "texts": _data_meta(data_cfg, split),
          "split": split, "variant": variant_meta,
          "tokenizer": {"bos_id": conv.bos_id, "bos_token": _token(tok, conv.bos_id), "adds_bos": conv.adds,
                        "eos_id": conv.eos_id, "eos_token": _token(tok, conv.eos_id), "from": conv.source,
                        "main_policy": main, "stream_tokens": int(len(stream))},
          "options": dataclasses.asdict(options), "provenance": provenance.analysis()}
  writer.write(out, result.summary, result.stats, meta)
  return result
