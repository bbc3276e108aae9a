"""grain input pipeline: documents -> token stream -> windows -> batches.

Each split's documents are tokenized once (bytes, each document followed by
EOS, in stored order) into a uint16 stream cached on disk under
``<data_dir>/abspos_tokens/``; windows are read from a memmap of it, so RAM
holds only what a batch needs. Window ``k`` starts at stream offset
``k * seq_len`` and every sequence has ``seq_len + 1`` tokens (the model sees
``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``):

- ``bos="prepend"``: ``[BOS_ID] + stream[k*L : k*L + L]`` (position 0 is always BOS);
- ``bos="none"``: ``stream[k*L : k*L + L + 1]`` (windows overlap by one token,
  so every stream transition is a target exactly once).

Both policies have ``(len(stream) - 1) // L`` windows over the same offsets, so
window ``k`` covers the same text under either policy; the tail remainder is
dropped and no PAD ever appears inside a sequence.
"""

import os
from pathlib import Path
from typing import Any

import grain
import numpy as np

from abspos_jax.config import BOS_POLICIES
from abspos_jax.data import builders
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID

SPLITS = ("train", "validation")
_STREAM_VERSION = "bytes-v1"  # bump when the tokenization or stream layout changes
_READ_CHUNK = 1024  # documents per batched read while tokenizing


def validate_data_config(data_cfg: Any) -> None:
  """Checks the fields the pipeline reads; dataset fields are checked on build.

  Raises:
    ValueError: naming the field and its allowed values.
  """
  if data_cfg.bos not in BOS_POLICIES:
    raise ValueError(f"data.bos must be one of {', '.join(BOS_POLICIES)}, got {data_cfg.bos!r}")
  if not isinstance(data_cfg.seq_len, int) or data_cfg.seq_len < 1:
    raise ValueError(f"data.seq_len must be a positive integer, got {data_cfg.seq_len!r}")
  if not isinstance(data_cfg.name, str) or not data_cfg.name:
    raise ValueError(f"data.name must be one of {', '.join(builders.BUILTIN_NAMES)} or the name"
                     f" of a prepared TFDS dataset, got {data_cfg.name!r}")


def _write_stream(source: Any, text_key: str, path: Path) -> None:
  tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
  eos = np.array([EOS_ID], np.uint16)
  with open(tmp, "wb") as f:
    for start in range(0, len(source), _READ_CHUNK):
      pieces = []
      for example in source.__getitems__(range(start, min(start + _READ_CHUNK, len(source)))):
        text = example[text_key]
        if text is None:  # what array_record hands back for a record past a truncation
          raise RuntimeError(f"a record of {text_key!r} is missing")
        text = text.encode("utf-8") if isinstance(text, str) else text
        if not isinstance(text, bytes):
          raise ValueError(f"data.text_key={text_key!r} holds {type(text).__name__}, not text")
        pieces += [np.frombuffer(text, np.uint8).astype(np.uint16), eos]
      if pieces:
        f.write(np.concatenate(pieces).tobytes())
  os.replace(tmp, path)  # atomic: readers never see a partial stream


def token_stream(data_cfg: Any, split: str = "train") -> np.ndarray:
  """The split's documents as one token stream (built and cached on first use).

  Returns:
    uint16 `[num_tokens]` (read-only memmap): each document's UTF-8 bytes
    followed by EOS_ID, documents in the dataset's stored order.
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
  prepared = builders.prepare_dataset(data_cfg)
  tfds_split = prepared.splits[split]
  cache = prepared.data_dir / "abspos_tokens" / prepared.builder.info.full_name / prepared.text_key
  path = cache / f"{tfds_split}.{_STREAM_VERSION}.u16"
  if not path.exists():
    with builders.file_lock(cache / f"{tfds_split}.lock"):
      if not path.exists():
        try:
          _write_stream(prepared.source(split), prepared.text_key, path)
        except ValueError:
          raise
        except Exception as e:  # array_record raises RuntimeError and friends for a damaged shard
          raise ValueError(
              f"the {split} split of data.name={data_cfg.name!r} cannot be read from its array_record files "
              f"under {prepared.data_dir} ({type(e).__name__}: {str(e).splitlines()[0][:300]}); the prepared data "
              f"is damaged: delete that directory to rebuild it") from e
  if path.stat().st_size == 0:  # mmap refuses empty files
    return np.zeros(0, np.uint16)
  return np.memmap(path, dtype=np.uint16, mode="r")


class TokenWindows:
  """Random-access `seq_len + 1`-token windows over a token stream.

  `windows[k]` is int32 `[seq_len + 1]`; see the module docstring for the
  layout under each BOS policy.
  """

  def __init__(self, stream: np.ndarray, seq_len: int, bos: str):
    if bos not in BOS_POLICIES:
      raise ValueError(f"data.bos must be one of {', '.join(BOS_POLICIES)}, got {bos!r}")
    self._stream = stream
    self._seq_len = seq_len
    self._prepend = bos == "prepend"
    self._len = max(0, (len(stream) - 1) // seq_len)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> np.ndarray:
    if not 0 <= index < self._len:
      raise IndexError(f"window {index} out of range [0, {self._len})")
    start, length = index * self._seq_len, self._seq_len
    if self._prepend:
      out = np.empty(length + 1, np.int32)
      out[0] = BOS_ID
      out[1:] = self._stream[start:start + length]
      return out
    return self._stream[start:start + length + 1].astype(np.int32)


def windows(data_cfg: Any, split: str = "train", bos: str | None = None) -> TokenWindows:
  """The windows of `split` under `bos` (default `data.bos`)."""
  validate_data_config(data_cfg)
  bos = data_cfg.bos if bos is None else bos
  if bos not in BOS_POLICIES:  # before any build
    raise ValueError(f"bos (overriding data.bos) must be one of {', '.join(BOS_POLICIES)}, got {bos!r}")
  return TokenWindows(token_stream(data_cfg, split), data_cfg.seq_len, bos)


def _as_batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
  return {"tokens": tokens}


def train_iterator(
    data_cfg: Any, *, batch_size: int, seed: int, process_index: int = 0, process_count: int = 1
) -> grain.DatasetIterator:
  """Infinite iterator of this process's training batches.

  Windows are shuffled (when `data.shuffle`; reshuffled every epoch, all from
  `seed`), repeated forever, and the resulting global sequence of windows is
  dealt round-robin: this process takes elements `process_index`,
  `process_index + process_count`, ... So processes never share a window
  within an epoch, and the union of all processes' step-`t` batches is the
  step-`t` batch a single process would get with `batch_size * process_count`.
  Reads are single-threaded and the order depends only on (data config,
  seed), so `set_state(get_state())` resumes exactly.

  Returns:
    grain `DatasetIterator` yielding `{"tokens": int32 [batch_size, seq_len + 1]}`;
    checkpoint it with `grain.checkpoint.CheckpointSave/CheckpointRestore`.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"need 0 <= process_index < process_count, got {process_index}, {process_count}")
  if not 0 <= seed < 2**32:
    raise ValueError(f"seed must be in [0, 2**32), got {seed}")
  source = windows(data_cfg, "train")
  if len(source) == 0:
    raise ValueError(f"the train split of data.name={data_cfg.name!r} has no window of"
                     f" data.seq_len + 1 = {data_cfg.seq_len + 1} tokens")
  ds = grain.MapDataset.source(source)
  if data_cfg.shuffle:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat()  # infinite; the shuffle seed is folded with the epoch
  ds = ds[process_index::process_count]
  ds = ds.batch(batch_size, drop_remainder=True).map(_as_batch)
  # num_threads=0: read in the calling thread; byte windows are cheap to read.
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def eval_sequences(
    data_cfg: Any, *, num_sequences: int, split: str = "validation", bos: str | None = None
) -> np.ndarray:
  """Fixed held-out sequences: `num_sequences` evenly spaced windows of `split`.

  Window `k * W // num_sequences` for `k < num_sequences` (`W` windows in the
  split), so the sample spans the whole split (and so its files) and, since
  both BOS policies share window offsets, covers the same text under either.

  Args:
    bos: "prepend" or "none"; overrides `data.bos`.

  Returns:
    int32 `[num_sequences, seq_len + 1]`.
  """
  if num_sequences < 1:
    raise ValueError(f"num_sequences must be >= 1, got {num_sequences}")
  source = windows(data_cfg, split, bos)
  if num_sequences > len(source):
    raise ValueError(f"the {split} split of data.name={data_cfg.name!r} has only {len(source)}"
                     f" windows of data.seq_len + 1 = {data_cfg.seq_len + 1} tokens;"
                     f" {num_sequences} were asked for")
  index = np.arange(num_sequences) * len(source) // num_sequences
  return np.stack([source[int(i)] for i in index])
