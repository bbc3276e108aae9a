"""GGUF files (llama.cpp, Ollama): the config from the metadata, the weights dequantised to float32, the tokenizer.

A GGUF file holds what a Hugging Face directory holds in three files: metadata
keys (``{arch}.block_count``, ``tokenizer.ggml.tokens``, ...) and tensors under
llama.cpp's names (``blk.0.attn_q.weight``), float or quantised in blocks.
Reading one is three translations, each through a library that owns the format:

- **metadata -> config.json**: :func:`hf_config` maps each ``{arch}.*`` key to
  the config.json field transformers would read, then
  :func:`~abspos_jax.interop.hf.config_from_hf` applies the same refusal policy
  as to a published config.json. An ``{arch}.*`` key we do not map is carried
  over under its own name, so it is refused by name (or dropped by
  ``--hf_ignore_fields``), never silently ignored.
- **tensors -> HF tensors**: names through gguf-py's ``TensorNameMap``, values
  through ``gguf.quants.dequantize`` (float32). llama.cpp's converter permutes
  the rows of Llama's q and k projections (its RoPE rotates adjacent pairs,
  HF's rotates halves); :func:`unpermute_qk` undoes it, as transformers does.
- **tokenizer**: transformers' GGUF tokenizer conversion, which gives a
  ``tokenizers.Tokenizer`` and the BOS convention of the file.

Architectures: ``llama`` (``mistral`` when the file's name says Mistral, as
transformers reads it) and ``qwen2``. Tensor types: :data:`TENSOR_TYPES`.
Needs the ``gguf`` package (and transformers for the tokenizer), in the
``.[hf]`` extra.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from abspos_jax.interop.hf.common import HFConversionError, refuse
from abspos_jax.interop.hf.config_map import ARCHITECTURES as HF_ARCHITECTURES

SUFFIX = ".gguf"
# general.architecture -> the HF model_type it is read as.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
# Tensor types we dequantise (gguf.quants implements each); everything else is refused by name.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
# {arch}.KEY -> config.json field.
_KEYS = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "vocab_size": "vocab_size",
    "attention.sliding_window": "sliding_window",
}
# {arch}.KEY -> config.json field, checked against the head size (a partial rotation or another head
# size is refused by config_from_hf under these names).
_HEAD_KEYS = {"attention.key_length": "head_dim", "attention.value_length": "head_dim"}
_TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id",
              "padding_token_id": "pad_token_id", "unknown_token_id": "unk_token_id"}


@dataclasses.dataclass(frozen=True)
class GGUFInfo:
  """What summary.json records of a GGUF file: its architecture, file type and tensor types."""

  architecture: str
  name: str | None
  file_type: str | None
  tensor_types: dict[str, int]

  def as_meta(self) -> dict:
    return {"format": "gguf", "architecture": self.architecture, "name": self.name, "file_type": self.file_type,
            "tensor_types": dict(self.tensor_types)}


def resolve(path: str) -> str | None:
  """The GGUF file ``path`` names: itself (a ``.gguf`` file), or the one ``.gguf`` in a directory that has
  no ``config.json``; None when ``path`` is not a GGUF checkpoint. Two ``.gguf`` files in one directory
  are refused (which one was meant is not ours to guess)."""
  if os.path.isfile(path):
    if path.endswith(SUFFIX) or _has_magic(path):
      return path
    return None
  if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
    return None
  found = sorted(f for f in os.listdir(path) if f.endswith(SUFFIX))
  if len(found) > 1:
    raise HFConversionError(f"{path} holds {len(found)} GGUF files ({', '.join(found)}): pass the file itself, "
                            f"e.g. --hf={os.path.join(path, found[0])}")
  return os.path.join(path, found[0]) if found else None


def _has_magic(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(4) == b"GGUF"


def open_reader(path: str):
  """A ``gguf.GGUFReader`` of ``path``; a truncated or corrupt file is refused with the reader's reason."""
  import gguf

  if not _has_magic(path):
    raise HFConversionError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF')")
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # gguf-py raises ValueError, IndexError, ... on a short or damaged file
    raise HFConversionError(f"{path} cannot be read as GGUF (truncated or corrupt?): {type(e).__name__}: {e}") from e


def metadata(reader) -> dict[str, Any]:
  """Every metadata key with its value, except the tokenizer's long arrays (their lengths instead)."""
  out = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
      out[key] = len(field.data)
      continue
    out[key] = field.contents()
  return out


def family_of(meta: Mapping[str, Any], where: str) -> tuple[str, str]:
  """``(arch, model_type)``: the file's ``general.architecture`` and the HF family it is read as."""
  arch = meta.get("general.architecture")
  if arch not in ARCHITECTURES:
    refuse(where, "general.architecture", arch, f"supported GGUF architectures: {', '.join(ARCHITECTURES)} "
           "(Mistral files say llama)")
  family = ARCHITECTURES[arch]
  # llama.cpp writes Mistral as llama; transformers reads a llama file named Mistral as Mistral.
  if arch == "llama" and "mistral" in str(meta.get("general.name", "")).lower():
    family = "mistral"
  return arch, family


def hf_config(meta: Mapping[str, Any], tensor_names: Iterable[str], where: str) -> dict:
  """The config.json a GGUF file's metadata describes (for :func:`~abspos_jax.interop.hf.config_from_hf`).

  ``{arch}.rope.dimension_count`` becomes ``partial_rotary_factor`` (refused
  unless the whole head rotates); ``{arch}.rope.scaling.*`` becomes
  ``rope_scaling`` (refused unless its type is ``none``); embeddings are tied
  when the file has no ``output.weight`` (llama.cpp writes it only when untied).
  Any other ``{arch}.*`` key keeps its GGUF name, so that ``config_from_hf``
  refuses it by name.
  """
  arch, family = family_of(meta, where)
  split = meta.get("split.count")
  if split not in (None, 0, 1):
    refuse(where, "split.count", split, "split GGUF files are not read; merge them first (llama-gguf-split --merge)")
  tensor_names = set(tensor_names)
  hf: dict[str, Any] = {"model_type": family, "architectures": [HF_ARCHITECTURES[family]]}
  rope_scaling: dict[str, Any] = {}
  rope_dims = None
  prefix = f"{arch}."
  for key, value in meta.items():
    if not key.startswith(prefix):
      continue
    sub = key[len(prefix):]
    if sub in _KEYS:
      hf[_KEYS[sub]] = value
    elif sub in _HEAD_KEYS:
      hf.setdefault(_HEAD_KEYS[sub], value)
      if hf[_HEAD_KEYS[sub]] != value:
        refuse(where, key, value, f"differs from {arch}.attention.key_length={hf['head_dim']}")
    elif sub == "rope.dimension_count":
      rope_dims = value
    elif sub.startswith("rope.scaling."):
      rope_scaling[sub[len("rope.scaling."):]] = value
    else:
      hf[key] = value
  if family == "mistral":
    hf.setdefault("sliding_window", None)  # llama.cpp attends to the whole context unless the file says otherwise
  elif "sliding_window" in hf:  # refused by its GGUF name: llama.cpp's llama and qwen2 do not slide
    hf[f"{arch}.attention.sliding_window"] = hf.pop("sliding_window")
  if rope_scaling and rope_scaling.get("type", "none") != "none":
    hf["rope_scaling"] = {"rope_type": rope_scaling.pop("type"), **rope_scaling}
  if rope_dims is not None and "hidden_size" in hf and "num_attention_heads" in hf:
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if rope_dims != head_dim:
      hf["partial_rotary_factor"] = rope_dims / head_dim
  if "vocab_size" not in hf and "tokenizer.ggml.tokens" in meta:
    hf["vocab_size"] = meta["tokenizer.ggml.tokens"]
  hf["tie_word_embeddings"] = "output.weight" not in tensor_names
  for gguf_key, field in _TOKEN_IDS.items():
    if f"tokenizer.ggml.{gguf_key}" in meta:
      hf[field] = meta[f"tokenizer.ggml.{gguf_key}"]
  if meta.get("general.name"):
    hf["_name_or_path"] = meta["general.name"]
  return hf


def unpermute_qk(w: np.ndarray, heads: int) -> np.ndarray:
  """Undo llama.cpp's row permutation of a Llama q or k projection ``w [heads * d_h, D]``.

  llama.cpp's converter writes ``w.reshape(heads, 2, d_h/2, D).swapaxes(1, 2)``:
  within each head, rows ``(r, d_h/2 + r)`` (HF's half-split RoPE pairs) become
  adjacent rows ``(2r, 2r+1)`` (ggml's pairwise RoPE). The inverse:
  ``w.reshape(heads, d_h/2, 2, D).swapaxes(1, 2).reshape(w.shape)``.
  """
  half = w.shape[0] // heads // 2
  return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _name_map(arch: str, hf_names: Iterable[str], num_layers: int) -> dict[str, str]:
  """GGUF tensor name -> HF tensor name, for the HF names our model of this config has."""
  import gguf

  model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
  names = gguf.get_tensor_name_map(model_arch, num_layers)
  out = {}
  for hf_name in hf_names:
    base, suffix = hf_name.rsplit(".", 1)
    gguf_name = names.get_name(base)
    if gguf_name is None:
      raise HFConversionError(f"gguf-py has no GGUF name for {hf_name} of architecture {arch}")
    out[f"{gguf_name}.{suffix}"] = hf_name
  return out


def check_tensor_types(reader, where: str) -> None:
  """Refuse the first tensor whose type we cannot dequantise, naming it, its type and the supported ones."""
  for t in reader.tensors:
    if t.tensor_type.name not in TENSOR_TYPES:
      refuse(where, f"tensor {t.name}", t.tensor_type.name, f"supported tensor types: {', '.join(TENSOR_TYPES)}")


def tensors(reader, arch: str, family: str, hf_names: Iterable[str], num_layers: int, num_heads: int,
            kv_heads: int, where: str) -> dict[str, np.ndarray]:
  """The file's tensors as float32 arrays under their HF names and in HF layout (``[out, in]``).

  Refuses an unsupported tensor type (naming the tensor, its type and the
  supported ones) and any tensor our model of this config has no place for.
  """
  from gguf import quants

  hf_names = list(hf_names)
  mapping = _name_map(arch, hf_names + (["lm_head.weight"] if "lm_head.weight" not in hf_names else []), num_layers)
  out = {}
  check_tensor_types(reader, where)
  for t in reader.tensors:
    kind = t.tensor_type.name
    if t.name not in mapping:
      refuse(where, f"tensor {t.name}", kind, f"a {family} model of this config has no such parameter "
             f"(e.g. rope_freqs.weight changes RoPE's frequencies)")
    try:
      w = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32)
    except Exception as e:  # a tensor cut short by a truncated file
      raise HFConversionError(f"{where}: tensor {t.name} ({kind}) cannot be dequantised (truncated or "
                              f"corrupt?): {e}") from e
    w = w.reshape(tuple(int(n) for n in reversed(t.shape)))  # ggml lists the fastest axis first
    if arch == "llama" and (".attn_q." in t.name or ".attn_k." in t.name):
      w = unpermute_qk(w, num_heads if ".attn_q." in t.name else kv_heads)
    out[mapping[t.name]] = w
  return out


def tensor_info(reader, meta: Mapping[str, Any]) -> GGUFInfo:
  import gguf

  file_type = meta.get("general.file_type")
  try:
    file_type = gguf.LlamaFileType(file_type).name if file_type is not None else None
  except ValueError:
    file_type = str(file_type)
  return GGUFInfo(architecture=str(meta.get("general.architecture")),
                  name=meta.get("general.name"), file_type=file_type,
                  tensor_types=dict(sorted(Counter(t.tensor_type.name for t in reader.tensors).items())))


def tokenizer(path: str, meta: Mapping[str, Any]):
  """``(tokenizers.Tokenizer, tokenizer_config)`` rebuilt from the file by transformers' GGUF conversion.

  ``tokenizer_config`` has ``add_bos_token`` and the special tokens as strings.
  A file without tokenizer metadata is refused: the analysis tokenises its
  texts with the checkpoint's own tokenizer.
  """
  if not meta.get("tokenizer.ggml.tokens") or "tokenizer.ggml.model" not in meta:
    raise HFConversionError(f"{path} has no tokenizer metadata (tokenizer.ggml.model / tokenizer.ggml.tokens): the "
                            "analysis tokenises its texts with the checkpoint's own tokenizer")
  from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

  try:
    arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(path)
    tok, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
  except (ValueError, KeyError) as e:
    raise HFConversionError(f"{path}: its tokenizer cannot be rebuilt: {e}") from e
  return tok, tokenizer_config
