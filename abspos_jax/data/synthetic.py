"""A seeded synthetic "language" with local filler and long-range copies.

Why: to study where a model reads position from, we want text in which most
next-byte targets are predictable from the local context only (so many heads
have nothing useful to attend to, the condition under which attention sinks
form), plus a few patterns whose targets are determined by a verbatim copy of
something earlier in the document (so some heads must look far back).

Generative process (all randomness from numpy ``Generator`` s; the language
seed ``params.seed`` fixes the lexicon, and every document has its own
generator ``document_rng(params, split, index)``):

1. Lexicon (from ``seed``): ``vocab`` distinct lowercase words of 2-7 letters
   drawn uniformly. Word ``r`` (in draw order) has unigram probability
   ``∝ (r + 1) ** -zipf``. Each word gets ``branching`` distinct successor
   words drawn from the unigram; successor ``k`` is taken with probability
   ``∝ 1 / (k + 1)``. This is a first-order Markov chain over words.
2. Document: ``S ~ Uniform{min_sentences..max_sentences}`` steps. Each step:

   a. Filler sentence: ``n ~ Uniform{min_words..max_words}`` words, the first
      from the unigram, each next one from the previous word's successors,
      joined by spaces and ended by ``". "``.
   b. Echo, with probability ``p_echo``: ``"> "`` then the sentence of (a)
      again, byte for byte (an induction/copy pattern at short range).
   c. Definition, with probability ``p_define``: ``"KEY=VAL. "`` with a fresh
      ``key_len``-letter uppercase key (distinct within the document) and a
      uniform ``value_len``-digit value.
   d. Recall, with probability ``p_recall`` if anything is defined yet:
      ``"KEY?VAL. "`` for a key drawn uniformly from the ``recall_span`` most
      recent definitions; ``VAL`` is copied from that definition (a long-range
      copy: its source is one or more sentences back).

Every byte gets a label: ``LOCAL`` (filler words and the fixed punctuation
``" "``, ``". "``, ``"> "``, ``"="``, ``"?"``: predictable at best from the
local context), ``FRESH`` (a new random choice: definition keys and values, the
recalled key) or ``COPY`` (a verbatim copy of an earlier byte of the same
document: echoed sentences and recalled values; ``source`` gives the offset of
the byte copied). Lowercase, uppercase, digits and ``>`` never share a role, so
the text can also be parsed back unambiguously (the tests do, and check the
parse against these labels).

``synthetic_statistics`` reports, over generated documents, the share of bytes
in each label (``copy_fraction`` is the fraction of targets determined by an
earlier copy), events per document, and how far back copies reach.
"""

import dataclasses
import functools
from typing import Any

import numpy as np

from abspos_jax.data import markov

LOCAL, FRESH, COPY = 0, 1, 2
SPLIT_CODES = markov.SPLIT_CODES  # 0 is the lexicon's stream


@dataclasses.dataclass(frozen=True)
class SyntheticParams:
  """Knobs of the language; see the module docstring for what each does."""

  seed: int = 0
  vocab: int = 256
  p_define: float = 0.25
  p_recall: float = 0.25
  p_echo: float = 0.15
  min_sentences: int = 8
  max_sentences: int = 48
  min_words: int = 4
  max_words: int = 12
  branching: int = 8
  zipf: float = 1.1
  recall_span: int = 4
  key_len: int = 3
  value_len: int = 3

  def __post_init__(self):
    for name in ("p_define", "p_recall", "p_echo"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"data.synthetic_{name} must be in [0, 1], got {getattr(self, name)}")
    if not 2 <= self.branching <= self.vocab:
      raise ValueError(f"data.synthetic_vocab must be >= {max(2, self.branching)}, got {self.vocab}")
    if self.seed < 0:
      raise ValueError(f"data.synthetic_seed must be >= 0, got {self.seed}")
    if not (1 <= self.min_sentences <= self.max_sentences and 1 <= self.min_words <= self.max_words):
      raise ValueError(f"invalid sentence/word length range in {self}")


def params_from_config(data_cfg: Any) -> SyntheticParams:
  """`SyntheticParams` from the `synthetic_*` fields of the `data` config."""
  return SyntheticParams(
      seed=int(data_cfg.synthetic_seed),
      vocab=int(data_cfg.synthetic_vocab),
      p_define=float(data_cfg.synthetic_p_define),
      p_recall=float(data_cfg.synthetic_p_recall),
      p_echo=float(data_cfg.synthetic_p_echo),
  )


@dataclasses.dataclass(frozen=True)
class _Lexicon:
  words: tuple[str, ...]
  unigram_cdf: np.ndarray  # [vocab]
  successors: np.ndarray  # int [vocab, branching]
  successor_cdf: np.ndarray  # [branching]


@functools.lru_cache(maxsize=8)
def _lexicon(seed: int, vocab: int, branching: int, zipf: float) -> _Lexicon:
  rng = np.random.default_rng([seed, 0])
  words: list[str] = []
  seen: set[str] = set()
  while len(words) < vocab:
    letters = rng.integers(0, 26, size=rng.integers(2, 8))
    word = "".join(chr(97 + int(c)) for c in letters)
    if word not in seen:
      seen.add(word)
      words.append(word)
  unigram = markov.zipf_weights(vocab, zipf)
  return _Lexicon(
      words=tuple(words),
      unigram_cdf=np.cumsum(unigram),
      successors=markov.successor_table(rng, unigram, branching),
      successor_cdf=np.cumsum(markov.successor_weights(branching)),
  )


@dataclasses.dataclass(frozen=True)
class SyntheticDocument:
  """A generated document with its construction.

  Attributes:
    text: the document (ASCII, so byte offsets equal character offsets).
    labels: uint8 `[len(text)]`, LOCAL / FRESH / COPY for every byte.
    source: int32 `[len(text)]`, for COPY bytes the offset of the earlier byte
      they copy (`text[i] == text[source[i]]`, `source[i] < i`); -1 elsewhere.
    num_definitions, num_recalls, num_echoes: events in the document.
  """

  text: str
  labels: np.ndarray
  source: np.ndarray
  num_definitions: int
  num_recalls: int
  num_echoes: int


class _Annotated:
  """Text as it is written, with each byte's label and, for a copied byte, the offset of the byte it copies."""

  def __init__(self):
    self.parts: list[str] = []
    self.labels: list[np.ndarray] = []
    self.sources: list[np.ndarray] = []
    self.length = 0

  def emit(self, text: str, label: int, source_start: int = -1) -> int:
    """Append ``text``; returns its offset."""
    start = self.length
    self.parts.append(text)
    self.labels.append(np.full(len(text), label, np.uint8))
    self.sources.append(np.arange(source_start, source_start + len(text), dtype=np.int32)
                        if label == COPY else np.full(len(text), -1, np.int32))
    self.length += len(text)
    return start


def _sentence(rng: np.random.Generator, lex: _Lexicon, params: SyntheticParams) -> str:
  """A bigram sentence: a Zipf first word, then successors, ending in ". "."""
  n_words = int(rng.integers(params.min_words, params.max_words + 1))
  word = int(markov.sample(lex.unigram_cdf, rng.random()))
  ids = [word]
  for k in markov.sample(lex.successor_cdf, rng.random(n_words - 1)):
    word = int(lex.successors[word, k])
    ids.append(word)
  return " ".join(lex.words[i] for i in ids) + ". "


def _fresh_key(rng: np.random.Generator, params: SyntheticParams, used_keys: set[str]) -> str:
  while True:
    key = "".join(chr(65 + int(c)) for c in rng.integers(0, 26, params.key_len))
    if key not in used_keys:
      used_keys.add(key)
      return key


def generate_annotated_document(rng: np.random.Generator, params: SyntheticParams) -> SyntheticDocument:
  """One document and the label of every byte (see the module docstring)."""
  lex = _lexicon(params.seed, params.vocab, params.branching, params.zipf)
  doc = _Annotated()
  definitions: list[tuple[str, str, int]] = []  # (key, value, offset of value)
  used_keys: set[str] = set()
  num_echoes = num_recalls = 0
  for _ in range(int(rng.integers(params.min_sentences, params.max_sentences + 1))):
    sentence = _sentence(rng, lex, params)
    sentence_at = doc.emit(sentence, LOCAL)
    if rng.random() < params.p_echo:
      doc.emit("> ", LOCAL)
      doc.emit(sentence, COPY, sentence_at)
      num_echoes += 1
    if rng.random() < params.p_define:
      key = _fresh_key(rng, params, used_keys)
      value = "".join(str(int(c)) for c in rng.integers(0, 10, params.value_len))
      doc.emit(key, FRESH)
      doc.emit("=", LOCAL)
      definitions.append((key, value, doc.emit(value, FRESH)))
      doc.emit(". ", LOCAL)
    if definitions and rng.random() < params.p_recall:
      recent = definitions[-params.recall_span:]
      key, value, value_at = recent[int(rng.integers(len(recent)))]
      doc.emit(key, FRESH)
      doc.emit("?", LOCAL)
      doc.emit(value, COPY, value_at)
      doc.emit(". ", LOCAL)
      num_recalls += 1
  return SyntheticDocument(text="".join(doc.parts), labels=np.concatenate(doc.labels),
                           source=np.concatenate(doc.sources), num_definitions=len(definitions),
                           num_recalls=num_recalls, num_echoes=num_echoes)


def generate_document(rng: np.random.Generator, params: SyntheticParams) -> str:
  """One document of the synthetic language (consumes `rng`)."""
  return generate_annotated_document(rng, params).text


# The generator of document `index` of `split` (splits never share a stream), and a split's documents in order.
document_rng = markov.params_rng
split_documents = functools.partial(markov.split_texts, generate_document)


def synthetic_statistics(
    params: SyntheticParams, *, split: str = "validation", num_docs: int = 200, context: int = 128
) -> dict[str, float]:
  """Statistics of the first `num_docs` documents of `split`, from their labels.

  Byte shares exclude the EOS the pipeline appends after each document.

  Returns:
    `documents`, `bytes_per_doc`; `local_fraction`, `fresh_fraction`,
    `copy_fraction` (shares of bytes; they sum to 1; `copy_fraction` is the
    fraction of next-byte targets fully determined by an earlier copy);
    `definitions_per_doc`, `recalls_per_doc`, `echoes_per_doc`;
    `mean_copy_distance` (bytes from a COPY byte back to its source) and
    `copy_within_context` (share of COPY bytes whose source is fewer than
    `context` bytes back, i.e. visible inside one window of that length).
  """
  counts = np.zeros(3, np.int64)
  distances: list[np.ndarray] = []
  events = np.zeros(3, np.int64)
  for i in range(num_docs):
    doc = generate_annotated_document(document_rng(params, split, i), params)
    counts += np.bincount(doc.labels, minlength=3)
    is_copy = doc.labels == COPY
    distances.append(np.nonzero(is_copy)[0] - doc.source[is_copy])
    events += (doc.num_definitions, doc.num_recalls, doc.num_echoes)
  total = counts.sum()
  dist = np.concatenate(distances) if distances else np.zeros(0)
  return {
      "documents": float(num_docs),
      "bytes_per_doc": float(total / max(num_docs, 1)),
      "local_fraction": float(counts[LOCAL] / total),
      "fresh_fraction": float(counts[FRESH] / total),
      "copy_fraction": float(counts[COPY] / total),
      "definitions_per_doc": float(events[0] / num_docs),
      "recalls_per_doc": float(events[1] / num_docs),
      "echoes_per_doc": float(events[2] / num_docs),
      "mean_copy_distance": float(dist.mean()) if dist.size else 0.0,
      "copy_within_context": float((dist < context).mean()) if dist.size else 0.0,
  }
