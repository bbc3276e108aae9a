"""Analysis options, declared once.

- :class:`AnalysisOptions`: what the estimators and the batch loop need
  (``analyze(model, sequences, options=...)``).
- :data:`FLAGS`: every option of ``analyze.py`` (what to analyse, which texts,
  how position 0 is set for imported checkpoints, variants, the batch), one
  :class:`Flag` each. They generate the absl flags (:func:`define_flags`), the
  keys a sweep may set per run (``sweep.analyze.<name>``, :func:`sweep_keys`
  and :func:`sweep_defaults`) and the flag table of docs/analysis.md
  (``python -m abspos_jax.analysis.options``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections
from absl import flags as absl_flags

from abspos_jax.config import BOS_POLICIES, replace_between

NUM_SEQUENCES = 256  # held-out sequences per BOS policy, unless told otherwise


@dataclasses.dataclass(frozen=True)
class AnalysisOptions:
  batch_size: int = 32  # the largest batch; smaller where a batch would not fit memory_budget_gb
  memory_budget_gb: float | None = None  # what a step may allocate; None: half the memory free at the start
  query_block: int | None = None  # queries per attention block (divides T); None: chosen from the memory budget
  early_max: int = 16  # early queries: 1 <= i < early_max
  sink_epsilon: float = 0.3  # Gu et al. (2024)
  sink_min_query: int = 4
  probe_ridge: float = 1e-2
  interventions: bool = True
  bos_replace_token: int = 10  # the "another token" of bos_replace: newline
  closedness_sequences: int = 4  # at most this many of the sweep's first batch rerun by the closedness check
  num_blocks: int = 16  # sequence blocks (seq_id % num_blocks) of the cross-fit halves and the jackknife
  progress: bool = True

  @classmethod
  def from_dict(cls, d: dict) -> "AnalysisOptions":
    """The options summary.json's ``meta.options`` records (defaults for fields it lacks, e.g. older ones)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in known})

  def validate(self) -> None:
    """Raises ``ValueError`` naming the field for a value the estimators cannot use."""
    if self.batch_size < 1:
      raise ValueError(f"batch_size (AnalysisOptions.batch_size) must be >= 1, got {self.batch_size}")
    if self.num_blocks < 2 or self.num_blocks % 2:
      raise ValueError(f"num_blocks (AnalysisOptions.num_blocks) must be an even number >= 2 (half = block % 2), "
                       f"got {self.num_blocks}")
    if self.memory_budget_gb is not None and not self.memory_budget_gb > 0:
      raise ValueError(f"memory_budget_gb (AnalysisOptions.memory_budget_gb) must be > 0, got {self.memory_budget_gb}")
    if self.query_block is not None and self.query_block < 1:
      raise ValueError(f"query_block (AnalysisOptions.query_block) must be >= 1 or None, got {self.query_block}")
    if self.early_max < 2:
      raise ValueError(f"early_max (AnalysisOptions.early_max) must be >= 2, got {self.early_max}")
    if self.closedness_sequences < 1:
      raise ValueError(f"closedness_sequences (AnalysisOptions.closedness_sequences) must be >= 1, got "
                       f"{self.closedness_sequences}")


@dataclasses.dataclass(frozen=True)
class Flag:
  """One option of ``analyze.py``.

  ``kind``: ``int``, ``float``, ``string``, ``bool``, ``enum`` (with
  ``choices``) or ``list`` (comma-separated). ``scope``: ``all`` (runs and
  ``--hf``), ``hf`` (imported checkpoints only). ``sweep``: a sweep may set
  it per run (``sweep.analyze.<name>``); ``sweep_default``: the sweep writes
  this value into every command unless told otherwise (None: it writes the flag
  only when set).
  """

  name: str
  default: Any
  doc: str
  kind: str
  choices: tuple[str, ...] = ()
  scope: str = "all"
  sweep: bool = True
  sweep_default: Any = None


FLAGS = (
    Flag("num_sequences", NUM_SEQUENCES, "Held-out sequences per BOS policy (>= 2: the estimators need two "
         "halves).", "int", sweep_default=NUM_SEQUENCES),
    Flag("split", "validation", "Data split the sequences come from.", "enum",
         ("train", "validation")),
    Flag("seq_len", None, "Tokens per sequence (runs: default and maximum the trained length; --hf: default 128, "
         "or max_position_embeddings if shorter).", "int"),
    Flag("data", None, "Texts to analyse: stdlib_text (code and prose), stdlib_prose (English prose), text_files "
         "(with --data_files) or a prepared TFDS dataset (with --text_key). Default: the run's own data; for --hf, "
         "stdlib_text.", "string"),
    Flag("data_files", None, "--data=text_files: comma-separated paths or globs.", "string"),
    Flag("text_key", None, "--data=a TFDS dataset: the feature holding the text.", "string"),
    Flag("batch_size", 32, "Largest number of sequences per jitted pass (smaller where a batch would exceed "
         "--memory_budget_gb).", "int"),
    Flag("memory_budget_gb", None, "GiB one analysis step may allocate (default: half the memory free at the "
         "start); the batch size is the largest that fits.", "float"),
    Flag("query_block", None, "Queries per block of each layer's attention (must divide --seq_len); default: "
         "all of them when a batch fits --memory_budget_gb, else the largest power of two that fits.", "int"),
    Flag("closedness_sequences", 4, "At most this many sequences of each sweep's first batch are rerun by the "
         "position-0 closedness check.", "int"),
    Flag("skip_interventions", False, "Skip the intervention sweep.", "bool", sweep_default=False),
    Flag("rope_scale", None, "ntk:ALPHA: analyse the checkpoint with its RoPE base scaled NTK-aware (an "
         "inference-time variant; the unmodified model's loss is reported too); --hf may then ask for up to ALPHA "
         "times its max_position_embeddings.", "string"),
    Flag("window", None, "Analyse the checkpoint with a sliding window of W keys (query included) on every layer: "
         "an inference-time variant.", "int"),
    Flag("bos", None, "The token (or id) put at position 0 under the prepend policy, instead of the tokenizer's "
         "BOS (a base model's is its pretraining separator, e.g. SmolLM2's <|endoftext|>).", "string", scope="hf",
         sweep=False),
    Flag("eos", None, "The token (or id) between documents, instead of the tokenizer's EOS.", "string", scope="hf",
         sweep=False),
    Flag("main_policy", None, "The BOS policy of the headline numbers and interventions (default: prepend when the "
         "tokenizer adds a BOS).", "enum", BOS_POLICIES, scope="hf", sweep=False),
    Flag("hf_ignore_fields", [], "config.json fields (or GGUF keys) to drop before mapping, when you know they do "
         "not matter here; recorded in summary.json.", "list", scope="hf", sweep=False),
)
BY_NAME = {f.name: f for f in FLAGS}


def define_flags(flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> dict[str, absl_flags.FlagHolder]:
  """Define every :data:`FLAGS` entry as an absl flag (in ``flag_values``); returns ``{name: FlagHolder}``."""
  out = {}
  for f in FLAGS:
    doc = ("--hf only: " if f.scope == "hf" else "") + f.doc
    if f.kind == "enum":
      out[f.name] = absl_flags.DEFINE_enum(f.name, f.default, list(f.choices), doc, flag_values=flag_values)
    else:
      define = {"int": absl_flags.DEFINE_integer, "float": absl_flags.DEFINE_float,
                "string": absl_flags.DEFINE_string, "bool": absl_flags.DEFINE_bool,
                "list": absl_flags.DEFINE_list}[f.kind]
      out[f.name] = define(f.name, f.default, doc, flag_values=flag_values)
  return out


def sweep_keys() -> tuple[str, ...]:
  """The ``analyze.py`` flags a sweep may set per run, in declaration order."""
  return tuple(f.name for f in FLAGS if f.sweep)


def sweep_defaults() -> ml_collections.ConfigDict:
  """``sweep.analyze``: ``enabled`` and every per-run flag (None: analyze.py's own default)."""
  a = ml_collections.ConfigDict()
  a.enabled = True
  for f in FLAGS:
    if f.sweep:
      a[f.name] = f.sweep_default
  return a


def markdown() -> str:
  """docs/analysis.md's flag table."""
  lines = ["| flag | default | for | meaning |", "|---|---|---|---|"]
  for f in FLAGS:
    default = "" if f.default in (None, []) else f"`{f.default}`"
    where = "--hf" if f.scope == "hf" else "runs, --hf"
    choices = " (" + " \\| ".join(f.choices) + ")" if f.choices else ""
    doc = f.doc.replace("|", "\\|")  # a literal | (e.g. in <|endoftext|>) would end the cell
    lines.append(f"| `--{f.name}` | {default} | {where}{'; sweeps' if f.sweep else ''} | {doc}{choices} |")
  return "\n".join(lines)


DOCS_BEGIN = "<!-- analyze.py flags: generated from abspos_jax/analysis/options.py by " \
             "`python -m abspos_jax.analysis.options` -->"
DOCS_END = "<!-- /analyze.py flags -->"


def write_docs(repo: str) -> None:
  """Rewrite the flag table of docs/analysis.md between its markers."""
  replace_between(os.path.join(repo, "docs", "analysis.md"), DOCS_BEGIN, DOCS_END, markdown())


if __name__ == "__main__":
  write_docs(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
