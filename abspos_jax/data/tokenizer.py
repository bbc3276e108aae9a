"""Byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then three specials.

Byte-level keeps the vocabulary tiny and fixed (no trained merges to ship or
version) and makes every text, in any language or encoding mishap, representable.
"""

from collections.abc import Iterable

import numpy as np

BOS_ID = 256  # beginning of sequence: put at position 0 when data.bos == "prepend"
EOS_ID = 257  # end of document: appended after every document in the stream
PAD_ID = 258  # padding: never inside training sequences; for callers that pad
VOCAB_SIZE = 259


def encode(text: str | bytes) -> np.ndarray:
  """UTF-8 bytes of `text` as ids, no specials added.

  Returns:
    int32 array `[num_bytes]` with values in 0..255.
  """
  data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
  return np.frombuffer(data, dtype=np.uint8).astype(np.int32)


def decode(ids: Iterable[int] | np.ndarray) -> str:
  """Text of the byte ids in `ids` (any shape, flattened); specials are skipped.

  Invalid UTF-8 (e.g. a window cut inside a multi-byte character) decodes to
  U+FFFD rather than raising.
  """
  arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids)).reshape(-1)
  return bytes(arr[arr < 256].astype(np.uint8)).decode("utf-8", errors="replace")
