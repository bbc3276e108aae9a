"""A checkpoint directory: read its config, load it as our model, export one of our runs into one."""

import json
import os

import ml_collections

from abspos_jax import storage
from abspos_jax import model as model_lib
from abspos_jax.data.tokenizer import VOCAB_SIZE
from abspos_jax.interop.hf.common import CONFIG, WEIGHTS, read_json
from abspos_jax.interop.hf.config_map import config_from_hf, config_to_hf
from abspos_jax.interop.hf.texts import write_byte_tokenizer
from abspos_jax.interop.hf.weights import load_safetensors, params_from_hf, params_to_hf


def read_config(hf_dir: str) -> dict:
  """``hf_dir/config.json`` as a dict; refuses a missing directory or file."""
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf {hf_dir} does not exist (a local directory with config.json and "
                            f"{WEIGHTS} is needed; nothing is downloaded)")
  path = os.path.join(hf_dir, CONFIG)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{hf_dir} has no {CONFIG}: not a Hugging Face model directory")
  return read_json(path)


def load_hf(hf_dir: str, *, seq_len: int) -> tuple[ml_collections.ConfigDict, model_lib.Decoder, dict]:
  """``(config, model, hf_config)`` of a local Llama / Mistral / Qwen2 checkpoint (float32 parameters)."""
  hf = read_config(hf_dir)
  config = config_from_hf(hf, seq_len=seq_len, where=os.path.join(hf_dir, CONFIG))
  model = params_from_hf(load_safetensors(hf_dir), config, where=hf_dir)
  return config, model, hf


def export(config: ml_collections.ConfigDict, model: model_lib.Decoder, out: str) -> dict:
  """Write ``config.json``, ``model.safetensors`` and the byte-level tokenizer of one of our runs into ``out``.

  Written to a temporary directory that replaces ``out`` all or nothing
  (:func:`abspos_jax.storage.directory`; in an object store ``config.json`` is
  uploaded last); an ``out`` that holds anything but a previous export is
  refused rather than replaced. Returns the HF config.
  """
  from safetensors.numpy import save_file

  hf = config_to_hf(config)  # refuses nope / learned / mixed patterns before anything is written
  target = storage.path(out)
  if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / CONFIG).exists())):
    raise FileExistsError(f"--out {out} exists and is not a previous export (no {CONFIG}); choose another --out")
  with storage.directory(out, ".export-", marker=CONFIG) as tmp:
    with open(os.path.join(tmp, CONFIG), "w") as f:
      json.dump(hf, f, indent=1)
    save_file(params_to_hf(model), os.path.join(tmp, WEIGHTS), metadata={"format": "pt"})
    if model.spec.vocab_size == VOCAB_SIZE:
      write_byte_tokenizer(tmp, add_bos=config.data.bos == "prepend", max_len=hf["max_position_embeddings"])
  return hf
