"""What every part of the Hugging Face interop shares: the file names of a checkpoint directory, the error."""

import json
from typing import Any

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"


class HFConversionError(ValueError):
  """A checkpoint (or one of our runs) cannot be converted exactly; the message names the field or tensor."""


def refuse(where: str, field: str, value: Any, why: str) -> None:
  raise HFConversionError(f"{where}: {field}={value!r} is not supported: {why}")


def first(*values: Any) -> Any:
  """The first value that is not None (else None)."""
  return next((v for v in values if v is not None), None)


def read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except json.JSONDecodeError as e:
    raise HFConversionError(f"{path} is not valid JSON: {e}") from e
  if not isinstance(value, dict):
    raise HFConversionError(f"{path} must hold a JSON object")
  return value
