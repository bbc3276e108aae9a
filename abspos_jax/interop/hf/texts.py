"""Tokenizers and analysis texts: our byte-level tokenizer as a ``tokenizers.Tokenizer``, a checkpoint's own
tokenizer (offline), its BOS convention and the analysis sequences it gives."""

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping

import numpy as np

from abspos_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from abspos_jax.interop.hf.common import (GENERATION_CONFIG, TOKENIZER, TOKENIZER_CONFIG, HFConversionError, first,
                                          read_json)

_BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>")  # BOS_ID, EOS_ID, PAD_ID = 256, 257, 258


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
  printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
  chars, n = {}, 0
  for b in range(256):
    if b in printable:
      chars[b] = chr(b)
    else:  # control bytes, space, ... map past 255 in order
      chars[b] = chr(256 + n)
      n += 1
  return chars


def byte_tokenizer(add_bos: bool):
  """A ``tokenizers.Tokenizer`` that reproduces ``abspos_jax.data.tokenizer``: ids 0..255 are the UTF-8
  bytes, 256/257/258 BOS/EOS/PAD; with ``add_bos`` it puts BOS at position 0 (``data.bos="prepend"``)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

  vocab = {c: b for b, c in _bytes_to_unicode().items()}
  # The specials live in the model vocabulary, not as added tokens: without
  # merges BPE never forms them, so a text that spells "<bos>" stays bytes,
  # as in abspos_jax.data.tokenizer.encode.
  vocab.update(dict(zip(_BYTE_SPECIALS, (BOS_ID, EOS_ID, PAD_ID))))
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  if add_bos:
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                       special_tokens=[("<bos>", BOS_ID)])
  return tok


def write_byte_tokenizer(out: str, *, add_bos: bool, max_len: int) -> None:
  """``tokenizer.json`` and ``tokenizer_config.json`` of our byte-level tokenizer in ``out``."""
  byte_tokenizer(add_bos).save(os.path.join(out, TOKENIZER))
  # split_special_tokens: transformers would otherwise read a literal "<bos>" in a text as BOS.
  with open(os.path.join(out, TOKENIZER_CONFIG), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
               "pad_token": "<pad>", "add_bos_token": add_bos, "add_eos_token": False,
               "model_max_length": max_len, "clean_up_tokenization_spaces": False,
               "split_special_tokens": True}, f, indent=1)


@dataclasses.dataclass(frozen=True)
class BosConvention:
  """What the checkpoint puts at position 0.

  ``bos_id``: its BOS token, or None when it names none. ``adds``: whether its
  tokenizer prepends it (then the analysis' main policy is ``prepend``).
  ``source``: where that was read, for the record. ``eos_id`` separates
  documents in the analysis stream (None: documents are simply concatenated).
  """

  bos_id: int | None
  adds: bool
  eos_id: int | None
  source: str


def load_tokenizer(hf_dir: str):
  """The checkpoint's own ``tokenizers.Tokenizer`` (``tokenizer.json``, read offline)."""
  from tokenizers import Tokenizer

  path = os.path.join(hf_dir, TOKENIZER)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{hf_dir} has no {TOKENIZER}: the analysis tokenises its texts with the "
                            "checkpoint's own fast tokenizer (save one with tokenizer.save_pretrained)")
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # tokenizers raises a plain Exception for malformed files
    raise HFConversionError(f"{path} cannot be read by tokenizers: {e}") from e


def _token_id(tok, value) -> int | None:
  """A token id from a tokenizer_config entry: a string, an AddedToken dict or None."""
  if isinstance(value, dict):
    value = value.get("content")
  return tok.token_to_id(value) if isinstance(value, str) else None


def _int_or_none(value) -> int | None:
  if isinstance(value, list):  # eos_token_id may be a list; the first is the document end
    value = value[0] if value else None
  return value if isinstance(value, int) and not isinstance(value, bool) else None


def bos_convention(hf_dir: str, tok, hf: Mapping) -> BosConvention:
  """Whether and with which id the checkpoint's tokenizer starts a text.

  ``add_bos_token`` of ``tokenizer_config.json`` wins (transformers rebuilds the
  post-processor from it); otherwise what ``tokenizer.json`` itself does when
  asked to add special tokens. The BOS id comes from the token it adds, else
  ``tokenizer_config.json``'s ``bos_token``, else ``generation_config.json`` /
  ``config.json``'s ``bos_token_id``.
  """
  tc_path = os.path.join(hf_dir, TOKENIZER_CONFIG)
  tc = read_json(tc_path) if os.path.exists(tc_path) else {}
  gc_path = os.path.join(hf_dir, GENERATION_CONFIG)
  gc = read_json(gc_path) if os.path.exists(gc_path) else {}
  plain = tok.encode("a", add_special_tokens=False).ids
  special = tok.encode("a", add_special_tokens=True).ids
  leading = special[0] if len(special) > len(plain) and special[1:len(plain) + 1] == plain else None
  bos_id = first(leading, _token_id(tok, tc.get("bos_token")), _int_or_none(gc.get("bos_token_id")),
                  _int_or_none(hf.get("bos_token_id")))
  eos_id = first(_token_id(tok, tc.get("eos_token")), _int_or_none(gc.get("eos_token_id")),
                  _int_or_none(hf.get("eos_token_id")))
  if isinstance(tc.get("add_bos_token"), bool):
    adds, source = tc["add_bos_token"] and bos_id is not None, f"{TOKENIZER_CONFIG} add_bos_token"
  else:
    adds, source = leading is not None, f"{TOKENIZER} post-processor"
  return BosConvention(bos_id=bos_id, adds=adds, eos_id=eos_id, source=source)


def token_id(tok, value: str | int, vocab_size: int, flag: str) -> int:
  """The id of ``value``: a token of ``tok`` (``"<|endoftext|>"``) or an id (``0``, ``"0"``), checked."""
  if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
    tid = int(value)
    if not 0 <= tid < vocab_size:
      raise ValueError(f"{flag}={value}: not a token id of this model (vocab_size {vocab_size})")
    return tid
  tid = tok.token_to_id(value)
  if tid is None:
    specials = sorted(t.content for t in tok.get_added_tokens_decoder().values())[:12]
    raise ValueError(f"{flag}={value!r} is not a token of this tokenizer's vocabulary"
                     + (f" (its added tokens include {', '.join(specials)})" if specials else ""))
  if tid >= vocab_size:
    raise ValueError(f"{flag}={value!r} has id {tid}, beyond the model's vocab_size {vocab_size}")
  return tid


def choose_special_tokens(tok, conv: BosConvention, *, bos: str | int | None = None, eos: str | int | None = None,
                          main_policy: str | None = None, vocab_size: int) -> BosConvention:
  """``conv`` with the user's choices: ``bos`` replaces its BOS token, ``eos`` its document separator, and
  ``main_policy="prepend"`` (which needs a BOS) or ``"none"`` its own choice (``adds``).

  A base model's BOS is the separator it was pretrained with (SmolLM2:
  ``<|endoftext|>``, id 0); an instruct tokenizer's ``bos_token`` may be a
  chat token (SmolLM2-Instruct's is ``<|im_start|>``), hence the choice.
  """
  bos_id = conv.bos_id if bos is None else token_id(tok, bos, vocab_size, "--bos")
  eos_id = conv.eos_id if eos is None else token_id(tok, eos, vocab_size, "--eos")
  adds, source = conv.adds, conv.source
  if main_policy is not None:
    if main_policy == "prepend" and bos_id is None:
      raise ValueError("--main_policy=prepend needs a BOS token, and this tokenizer names none: pass --bos=TOKEN")
    adds, source = main_policy == "prepend", "--main_policy"
  if bos is not None or eos is not None:
    source += " (" + ", ".join(f for f, v in (("--bos", bos), ("--eos", eos)) if v is not None) + " given)"
  return BosConvention(bos_id=bos_id, adds=adds and bos_id is not None, eos_id=eos_id, source=source)


def token_stream(tok, documents: Iterable[str], eos_id: int | None) -> np.ndarray:
  """``doc_0 EOS doc_1 EOS ...`` tokenised without special tokens (EOS omitted when ``eos_id`` is None)."""
  parts = []
  for enc in tok.encode_batch(list(documents), add_special_tokens=False):
    parts.append(np.asarray(enc.ids, np.int64))
    if eos_id is not None:
      parts.append(np.asarray([eos_id], np.int64))
  return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def analysis_sequences(stream: np.ndarray, *, num_sequences: int, seq_len: int, conv: BosConvention,
                       vocab_size: int) -> dict[str, np.ndarray]:
  """Model inputs ``{policy: int32 [num_sequences, seq_len]}``, laid out like ``data.eval_sequences``.

  Window ``k`` starts at stream offset ``k * seq_len``; ``prepend`` is
  ``[BOS] + stream[k L : k L + L - 1]`` (only when a BOS id is known), ``none``
  is ``stream[k L : k L + L]``, so both cover the same text. Windows
  ``k * W // N`` of the ``W`` available are taken.
  """
  windows = max(0, (len(stream) - 1) // seq_len)
  if num_sequences > windows:
    raise ValueError(f"the analysis text has only {windows} windows of {seq_len} tokens of this tokenizer; "
                     f"{num_sequences} were asked for")
  if len(stream) and int(stream.max()) >= vocab_size:
    raise HFConversionError(f"the tokenizer produced id {int(stream.max())}, beyond the model's vocab_size "
                            f"{vocab_size}")
  starts = (np.arange(num_sequences) * windows // num_sequences) * seq_len
  none = np.stack([stream[s:s + seq_len] for s in starts]).astype(np.int32)
  if conv.bos_id is None:
    return {"none": none}
  if conv.bos_id >= vocab_size:
    raise HFConversionError(f"bos_token_id {conv.bos_id} is beyond the model's vocab_size {vocab_size}")
  prepend = np.concatenate([np.full((num_sequences, 1), conv.bos_id, np.int32), none[:, :-1]], 1)
  return {"prepend": prepend, "none": none}
