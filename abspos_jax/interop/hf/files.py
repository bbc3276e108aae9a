"""A checkpoint on disk (a Hugging Face directory or a GGUF file): read its config, tokenizer and weights as our
model; export one of our runs as a Hugging Face directory."""

import json
import os
from collections.abc import Iterable

import ml_collections

from abspos_jax import provenance, storage
from abspos_jax import model as model_lib
from abspos_jax.data.tokenizer import VOCAB_SIZE
from abspos_jax.interop import gguf
from abspos_jax.interop.hf.common import CONFIG, WEIGHTS, HFConversionError, read_json
from abspos_jax.interop.hf.config_map import config_from_hf, config_to_hf
from abspos_jax.interop.hf.texts import BosConvention, bos_convention, load_tokenizer, write_byte_tokenizer
from abspos_jax.interop.hf.weights import hf_tensor_names, load_safetensors, params_from_hf, params_to_hf


class Checkpoint:
  """A checkpoint on disk, as published: a Hugging Face directory (config.json, safetensors, tokenizer.json)
  or a GGUF file (or a directory holding exactly one). Each step reads only what it needs, so a bad
  config or a missing tokenizer is refused before the weights are read.

  ``hf_config``: the config.json (for GGUF, the one its metadata describes,
  :func:`abspos_jax.interop.gguf.hf_config`). ``format``: ``"safetensors"`` or
  ``"gguf"``. ``file``: the GGUF file, or None.
  """

  def __init__(self, path: str):
    if not os.path.exists(path):
      raise FileNotFoundError(f"--hf {path} does not exist (a local Hugging Face directory with {CONFIG} and "
                              f"{WEIGHTS}, or a .gguf file, is needed; nothing is downloaded)")
    self.path = path
    self.file = gguf.resolve(path)
    self.format = "gguf" if self.file else "safetensors"
    if self.file:
      self._reader = gguf.open_reader(self.file)
      self._meta = gguf.metadata(self._reader)
      gguf.check_tensor_types(self._reader, self.file)  # before anything else is read
      self.hf_config = gguf.hf_config(self._meta, (t.name for t in self._reader.tensors), where=self.file)
    elif os.path.isfile(path):
      raise HFConversionError(f"--hf {path} is a file but not a GGUF file: pass a .gguf file or a Hugging Face "
                              f"directory ({CONFIG} + safetensors)")
    else:
      config_path = os.path.join(path, CONFIG)
      if not os.path.exists(config_path):
        raise FileNotFoundError(f"{path} has no {CONFIG} and no .gguf file: not a Hugging Face model directory")
      self.hf_config = read_json(config_path)

  @property
  def where(self) -> str:
    """What error messages name: the GGUF file or the directory's config.json."""
    return self.file or os.path.join(self.path, CONFIG)

  def config(self, seq_len: int, ignore: Iterable[str] = (), context_scale: float = 1.0) -> ml_collections.ConfigDict:
    return config_from_hf(self.hf_config, seq_len=seq_len, where=self.where, ignore=ignore,
                          context_scale=context_scale)

  def model(self, config: ml_collections.ConfigDict) -> model_lib.Decoder:
    """Our model of ``config`` (from :meth:`config`) with the checkpoint's weights in float32."""
    if not self.file:
      return params_from_hf(load_safetensors(self.path), config, where=self.path)
    spec = model_lib.ModelSpec.from_config(config)
    tensors = gguf.tensors(self._reader, str(self._meta["general.architecture"]), self.hf_config["model_type"],
                           hf_tensor_names(spec), spec.num_layers, spec.num_heads, spec.kv_heads, where=self.file)
    return params_from_hf(tensors, config, where=self.file)

  def tokenizer(self):
    """``(tokenizers.Tokenizer, BosConvention)``: the checkpoint's own tokenizer and what it puts at position 0."""
    if not self.file:
      tok = load_tokenizer(self.path)
      return tok, bos_convention(self.path, tok, self.hf_config)
    tok, tc = gguf.tokenizer(self.file, self._meta)
    bos_id, eos_id = self._meta.get("tokenizer.ggml.bos_token_id"), self._meta.get("tokenizer.ggml.eos_token_id")
    adds = bool(tc.get("add_bos_token")) and bos_id is not None
    return tok, BosConvention(bos_id=bos_id, adds=adds, eos_id=eos_id, source="GGUF tokenizer.ggml.add_bos_token")

  def describe(self) -> dict:
    """summary.json's ``meta.checkpoint``: the format, its files (size, mtime, SHA-256 up to 256 MiB) and,
    for GGUF, the architecture, file type and tensor types."""
    files = [self.file] if self.file else sorted(
        os.path.join(self.path, f) for f in os.listdir(self.path)
        if f.endswith((".json", ".safetensors")) and os.path.isfile(os.path.join(self.path, f)))
    out = {"format": self.format, "path": os.path.abspath(self.path),
           "files": {os.path.basename(f): provenance.file_fingerprint(f) for f in files}}
    if self.file:
      out.update(gguf.tensor_info(self._reader, self._meta).as_meta())
    return out


def read_config(path: str) -> dict:
  """The checkpoint's config.json as a dict (for a GGUF file, the one its metadata describes)."""
  return Checkpoint(path).hf_config


def load_hf(path: str, *, seq_len: int, ignore: Iterable[str] = ()
            ) -> tuple[ml_collections.ConfigDict, model_lib.Decoder, dict]:
  """``(config, model, hf_config)`` of a local Llama / Mistral / Qwen2 checkpoint: a Hugging Face directory or a
  GGUF file (float32 parameters; quantised GGUF tensors dequantised). ``ignore``: see ``config_from_hf``."""
  ckpt = Checkpoint(path)
  config = ckpt.config(seq_len, ignore)
  return config, ckpt.model(config), ckpt.hf_config


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
