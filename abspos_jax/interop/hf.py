"""Hugging Face interop: Llama, Mistral and Qwen2 checkpoints <-> our :class:`~abspos_jax.model.Decoder`.

Our decoder is Llama-shaped on purpose (DESIGN section 2), so a conversion is
a renaming plus transposes: same half-split RoPE, same RMSNorm (float32,
``weight * normed``), same SwiGLU, same ``1/sqrt(d_h)`` scaling, same sliding
window (``i - W < j <= i``; transformers' ``sliding_window_overlay`` is
``kv_idx > q_idx - sliding_window``). Nothing is approximated: a config field
or tensor that we cannot reproduce exactly is refused with its name.

- Config, both ways: :func:`config_to_hf` (export) and :func:`config_from_hf`
  (import). See ``docs/interop.md`` for the field-by-field table.
- Weights, both ways: :func:`params_to_hf` and :func:`params_from_hf`; HF
  linear weights are ``[out, in]``, ours ``[in, ...]``.
- Files: :func:`load_safetensors` (``model.safetensors`` or the shards listed
  in ``model.safetensors.index.json``), :func:`export` (``config.json``,
  ``model.safetensors`` and a byte-level ``tokenizer.json``) and
  :func:`load_hf`.
- Analysis texts: :func:`load_tokenizer`, :func:`bos_convention` and
  :func:`analysis_sequences` (the checkpoint's own tokenizer, offline).

Needs ``safetensors`` and ``tokenizers`` (the ``.[hf]`` extra), imported
inside the functions so that the core package never needs them; transformers
and torch are only used by the tests, to check parity.
"""

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import atomic
from abspos_jax import config as config_lib
from abspos_jax import model as model_lib
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"

# Fields of config.json that every family maps (or checks) on import.
_COMMON_FIELDS = frozenset({
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size", "rms_norm_eps", "hidden_act", "tie_word_embeddings", "head_dim", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "max_position_embeddings",
})
_FAMILY_FIELDS = {
    "llama": frozenset({"attention_bias", "mlp_bias", "rope_interleaved"}),
    "mistral": frozenset({"sliding_window"}),
    "qwen2": frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}),
}
# Fields that do not change the forward pass in evaluation: metadata, token ids,
# generation and training-only settings (dropout is off at evaluation;
# pretraining_tp only splits Llama's matmuls). Anything neither here nor mapped
# is refused, since it might change the computation.
_INERT_FIELDS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout",
    "pretraining_tp", "output_attentions", "output_hidden_states", "return_dict",
    "is_llama_config",  # a marker some nanotron-converted Llama configs carry
})
_ROPE_KEYS = frozenset({"rope_theta", "rope_type", "type", "partial_rotary_factor"})
_DEFAULT_ROPE_THETA = 10000.0  # transformers' default_theta
_BYTE_SPECIALS = ("<bos>", "<eos>", "<pad>")  # BOS_ID, EOS_ID, PAD_ID = 256, 257, 258


class HFConversionError(ValueError):
  """A checkpoint (or one of our runs) cannot be converted exactly; the message names the field or tensor."""


def _refuse(where: str, field: str, value: Any, why: str) -> None:
  raise HFConversionError(f"{where}: {field}={value!r} is not supported: {why}")


def _first(*values: Any) -> Any:
  """The first value that is not None (else None)."""
  return next((v for v in values if v is not None), None)


# --------------------------------------------------------------------------- config


def export_family(spec: model_lib.ModelSpec) -> str:
  """The HF family an export uses: Llama (``rope``, ``ntk``), Mistral (``swa``), or Qwen2 where only it fits.

  Qwen2 is needed for q/k/v biases and for a local/global ``layer_pattern``
  (its ``layer_types``; Mistral windows every layer); its biases are written as
  zeros for a model without them. ``nope`` and ``learned`` are refused.
  """
  if spec.position in ("nope", "learned"):
    why = ("Llama-family models always rotate q and k, so a model without any position signal has no equivalent"
           if spec.position == "nope" else
           "Llama-family models have no learned absolute position embeddings, and their RoPE cannot be switched off")
    _refuse("export", "model.position", spec.position, why)
  mixed = spec.position == "swa" and "G" in spec.layer_pattern
  if spec.qkv_bias or mixed:
    return "qwen2"
  return "mistral" if spec.position == "swa" else "llama"


def config_to_hf(config: ml_collections.ConfigDict) -> dict:
  """The ``config.json`` of an export (see :func:`export_family`).

  The NTK model's base ``rope_base * ntk_alpha ** (d_h / (d_h - 2))`` is
  written as ``rope_theta``: the function is plain RoPE with that base.
  """
  spec = model_lib.ModelSpec.from_config(config)
  family = export_family(spec)
  theta = float(spec.attention_base())
  hf = {
      "architectures": [ARCHITECTURES[family]],
      "model_type": family,
      "vocab_size": spec.vocab_size,
      "hidden_size": spec.d_model,
      "intermediate_size": spec.mlp_dim,
      "num_hidden_layers": spec.num_layers,
      "num_attention_heads": spec.num_heads,
      "num_key_value_heads": spec.kv_heads,
      "head_dim": spec.head_dim,
      "hidden_act": "silu",
      "rms_norm_eps": spec.norm_eps,
      "tie_word_embeddings": spec.tie_embeddings,
      "max_position_embeddings": max(int(config.data.seq_len), spec.max_len),
      # Both spellings of the RoPE base: transformers >= 5 reads rope_parameters,
      # older versions (and tools that parse config.json themselves) rope_theta.
      "rope_theta": theta,
      "rope_parameters": {"rope_type": "default", "rope_theta": theta},
      "initializer_range": spec.init_std,
      "dtype": spec.param_dtype,
      "torch_dtype": spec.param_dtype,
      "use_cache": True,
  }
  windows = spec.layer_windows()
  if family == "llama":
    hf.update(attention_bias=False, mlp_bias=False)
  elif family == "mistral":
    hf["sliding_window"] = spec.window
  else:
    local = spec.position == "swa"
    hf.update(use_sliding_window=local, sliding_window=spec.window if local else None, max_window_layers=0,
              layer_types=["full_attention" if w is None else "sliding_attention" for w in windows])
  if spec.vocab_size == VOCAB_SIZE:  # our byte-level ids
    hf.update(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
  return hf


def _positive_int(hf: Mapping, field: str, where: str) -> int:
  value = hf.get(field)
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    _refuse(where, field, value, "must be a positive integer")
  return value


def _rope_base(hf: Mapping, where: str) -> float:
  """``rope_theta``, refusing any RoPE variant other than the default (half-split, unscaled)."""
  legacy = hf.get("rope_scaling")
  # transformers >= 5 takes a non-empty legacy rope_scaling over rope_parameters.
  field = "rope_scaling" if legacy else "rope_parameters"
  params = legacy or hf.get("rope_parameters") or {}
  if not isinstance(params, Mapping):
    _refuse(where, field, params, "must be a JSON object")
  if params and not set(params) & {"rope_type", "type", "rope_theta"}:
    # Nested per layer type ({"full_attention": {...}, ...}): fine when all are the same.
    nested = list(params.values())
    if not all(isinstance(v, Mapping) for v in nested) or any(v != nested[0] for v in nested):
      _refuse(where, field, params, "different RoPE per layer type is not implemented")
    params = nested[0]
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type != "default":
    _refuse(where, f"{field}.rope_type", rope_type,
            "only unscaled RoPE ('default') is implemented; scaled variants change the frequencies")
  for key in sorted(set(params) - _ROPE_KEYS):
    _refuse(where, f"{field}.{key}", params[key], "not part of default RoPE")
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    _refuse(where, "partial_rotary_factor", partial, "only full rotation (1.0) is implemented")
  theta = _first(params.get("rope_theta"), hf.get("rope_theta"), _DEFAULT_ROPE_THETA)  # null counts as absent
  if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
    _refuse(where, f"{field}.rope_theta", theta, "must be a positive number")
  return float(theta)


def _layer_windows(hf: Mapping, family: str, num_layers: int, where: str) -> tuple[int | None, str]:
  """``(window or None, layer_pattern)`` as the installed transformers would apply them."""
  if family == "llama":
    return None, ""
  if family == "mistral":
    window = hf.get("sliding_window")
    if window is None:
      return None, ""
    return _positive_int(hf, "sliding_window", where), ""
  # Qwen2: a window only with use_sliding_window, on the layers whose
  # layer_types entry is sliding_attention (default: layers >= max_window_layers).
  use = _first(hf.get("use_sliding_window"), False)
  if not isinstance(use, bool):
    _refuse(where, "use_sliding_window", use, "must be true or false")
  types = hf.get("layer_types")
  if types is not None:
    if (not isinstance(types, list) or len(types) != num_layers
        or set(types) - {"full_attention", "sliding_attention"}):
      _refuse(where, "layer_types", types, f"must list {num_layers} entries of full_attention / sliding_attention")
  if not use:
    if types is not None and "sliding_attention" in types:
      _refuse(where, "layer_types", types, "names sliding layers although use_sliding_window is false")
    return None, ""
  window = _positive_int(hf, "sliding_window", where)
  if types is None:
    first = _first(hf.get("max_window_layers"), 28)  # Qwen2Config's default
    if not isinstance(first, int) or isinstance(first, bool) or first < 0:
      _refuse(where, "max_window_layers", first, "must be an integer >= 0")
    types = ["sliding_attention" if l >= first else "full_attention" for l in range(num_layers)]
  if "sliding_attention" not in types:
    return None, ""
  pattern = "".join("L" if t == "sliding_attention" else "G" for t in types)
  return window, "" if "G" not in pattern else pattern


def config_from_hf(hf: Mapping, *, seq_len: int, where: str = CONFIG) -> ml_collections.ConfigDict:
  """Our config for a Llama / Mistral / Qwen2 ``config.json`` (a dict), validated.

  ``seq_len`` becomes ``data.seq_len`` (the analysis length). Raises
  :class:`HFConversionError` naming the first field that cannot be reproduced
  exactly, or any field we do not know (it might change the computation).
  """
  family = hf.get("model_type")
  if family not in ARCHITECTURES:
    _refuse(where, "model_type", family, f"supported families: {', '.join(ARCHITECTURES)}")
  archs = hf.get("architectures")
  if archs is not None and archs != [ARCHITECTURES[family]]:
    _refuse(where, "architectures", archs, f"only the causal LM {ARCHITECTURES[family]} is supported")
  unknown = sorted(set(hf) - _COMMON_FIELDS - _FAMILY_FIELDS[family] - _INERT_FIELDS)
  if unknown:
    _refuse(where, unknown[0], hf[unknown[0]], f"abspos_jax does not know this {family} field "
            f"(unknown fields: {', '.join(unknown)}); refusing rather than guessing what it does")
  d_model = _positive_int(hf, "hidden_size", where)
  num_heads = _positive_int(hf, "num_attention_heads", where)
  num_layers = _positive_int(hf, "num_hidden_layers", where)
  kv_heads = hf.get("num_key_value_heads") or num_heads
  if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or num_heads % kv_heads:
    _refuse(where, "num_key_value_heads", kv_heads, f"must divide num_attention_heads={num_heads}")
  if _first(hf.get("hidden_act"), "silu") not in ("silu", "swish"):
    _refuse(where, "hidden_act", hf["hidden_act"], "the MLP is SwiGLU (silu) only")
  if d_model % num_heads:
    _refuse(where, "num_attention_heads", num_heads, f"must divide hidden_size={d_model}")
  head_dim = hf.get("head_dim")
  if head_dim is not None and head_dim != d_model // num_heads:
    _refuse(where, "head_dim", head_dim, f"our head dimension is hidden_size / num_attention_heads = "
            f"{d_model // num_heads}")
  for field in ("attention_bias", "mlp_bias"):
    if hf.get(field, False):
      _refuse(where, field, hf[field], "no biases there (Llama's attention_bias also biases o_proj)")
  if hf.get("rope_interleaved", False):  # nanotron's flag; transformers' Llama always rotates half-split
    _refuse(where, "rope_interleaved", hf["rope_interleaved"], "only the half-split RoPE layout is implemented")
  tie = _first(hf.get("tie_word_embeddings"), False)
  if not isinstance(tie, bool):
    _refuse(where, "tie_word_embeddings", tie, "must be true or false")
  eps = _first(hf.get("rms_norm_eps"), 1e-6)  # the default of all three families
  if not isinstance(eps, (int, float)) or eps <= 0:
    _refuse(where, "rms_norm_eps", eps, "must be a positive number")
  max_pos = hf.get("max_position_embeddings")
  if max_pos is not None and seq_len > max_pos:
    _refuse(where, "max_position_embeddings", max_pos, f"shorter than the {seq_len} tokens asked for")
  window, pattern = _layer_windows(hf, family, num_layers, where)

  c = config_lib.base_config()
  m = c.model
  m.position = "rope" if window is None else "swa"
  m.num_layers, m.d_model, m.num_heads = num_layers, d_model, num_heads
  m.num_kv_heads = kv_heads
  m.qkv_bias = family == "qwen2"
  m.mlp_dim = _positive_int(hf, "intermediate_size", where)
  m.vocab_size = _positive_int(hf, "vocab_size", where)
  m.rope_base = _rope_base(hf, where)
  if window is not None:
    m.window, m.layer_pattern = window, pattern
  m.tie_embeddings = tie
  m.norm_eps = float(eps)
  m.dtype = m.param_dtype = "float32"  # analysis in float32, whatever the stored dtype
  c.data.seq_len = seq_len
  try:
    config_lib.validate(c, num_devices=1)
  except config_lib.ConfigError as e:
    raise HFConversionError(f"{where}: the checkpoint maps to an invalid abspos_jax config: {e}") from e
  return c


# --------------------------------------------------------------------------- weights


def _hf_names(spec: model_lib.ModelSpec) -> dict[str, tuple]:
  """HF tensor name -> our parameter path, for every tensor the model has."""
  names = {"model.embed_tokens.weight": ("embed",), "model.norm.weight": ("final_norm", "scale")}
  if not spec.tie_embeddings:
    names["lm_head.weight"] = ("unembed",)
  for l in range(spec.num_layers):
    p, b = f"model.layers.{l}.", ("blocks", l)
    names[p + "input_layernorm.weight"] = (*b, "attn_norm", "scale")
    names[p + "post_attention_layernorm.weight"] = (*b, "mlp_norm", "scale")
    for proj, ours in (("q", "wq"), ("k", "wk"), ("v", "wv"), ("o", "wo")):
      names[p + f"self_attn.{proj}_proj.weight"] = (*b, "attn", ours)
    if spec.qkv_bias:
      for proj in "qkv":
        names[p + f"self_attn.{proj}_proj.bias"] = (*b, "attn", f"b{proj}")
    for proj in ("gate", "up", "down"):
      names[p + f"mlp.{proj}_proj.weight"] = (*b, "mlp", proj)
  return names


def _to_hf(path: tuple, x: np.ndarray) -> np.ndarray:
  """Our array at ``path`` in HF layout (``[out, in]`` for linear weights)."""
  leaf = path[-1]
  if leaf in ("wq", "wk", "wv"):  # [D, heads, d_h] -> [heads * d_h, D]
    return x.reshape(x.shape[0], -1).T
  if leaf == "wo":  # [H, d_h, D] -> [D, H * d_h]
    return x.reshape(-1, x.shape[-1]).T
  if leaf in ("bq", "bk", "bv"):  # [heads, d_h] -> [heads * d_h]
    return x.reshape(-1)
  if leaf in ("gate", "up", "down", "unembed"):  # [in, out] -> [out, in]
    return x.T
  return x  # embed [V, D], norm scales [D]


def _from_hf(path: tuple, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  """The HF tensor ``x`` in our layout ``shape`` (the inverse of :func:`_to_hf`)."""
  leaf = path[-1]
  if leaf in ("wq", "wk", "wv", "wo"):
    return x.T.reshape(shape)
  if leaf in ("bq", "bk", "bv"):
    return x.reshape(shape)
  if leaf in ("gate", "up", "down", "unembed"):
    return x.T
  return x


def _expected_hf_shape(path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  return _to_hf(path, np.empty(shape, np.int8)).shape


def _flat_params(model: model_lib.Decoder) -> dict[tuple, np.ndarray]:
  _, params = nnx.split(model, nnx.Param)
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    flat[tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))] = np.asarray(leaf)
  return flat


def params_to_hf(model: model_lib.Decoder) -> dict[str, np.ndarray]:
  """Every parameter of ``model`` under its HF name and layout (C-contiguous, in the parameter dtype).

  For a Qwen2 export of a model without q/k/v biases, the biases Qwen2 always
  has are written as zeros.
  """
  spec = model.spec
  flat = _flat_params(model)
  out = {name: np.ascontiguousarray(_to_hf(path, flat[path])) for name, path in _hf_names(spec).items()}
  if export_family(spec) == "qwen2" and not spec.qkv_bias:
    dtype = np.dtype(spec.param_dtype)
    for l in range(spec.num_layers):
      for proj, heads in (("q", spec.num_heads), ("k", spec.kv_heads), ("v", spec.kv_heads)):
        out[f"model.layers.{l}.self_attn.{proj}_proj.bias"] = np.zeros(heads * spec.head_dim, dtype)
  return out


def params_from_hf(tensors: Mapping[str, np.ndarray], config: ml_collections.ConfigDict, *,
                   where: str = "checkpoint") -> model_lib.Decoder:
  """Our model of ``config`` with the HF ``tensors`` (cast to the parameter dtype).

  Refuses missing, unexpected and mis-shaped tensors, naming them. Ignored:
  ``lm_head.weight`` when the embeddings are tied (transformers ties it too)
  and the ``rotary_emb.inv_freq`` buffers some older checkpoints store
  (recomputed from the config).
  """
  abstract = nnx.eval_shape(lambda: model_lib.create(config))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  spec = abstract.spec
  names = _hf_names(spec)
  ignored = {n for n in tensors if n.endswith("rotary_emb.inv_freq")}
  if spec.tie_embeddings:
    ignored |= {"lm_head.weight"} & set(tensors)
  missing = sorted(set(names) - set(tensors))
  if missing:
    raise HFConversionError(f"{where}: missing tensors {', '.join(missing[:8])}"
                            + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
  unexpected = sorted(set(tensors) - set(names) - ignored)
  if unexpected:
    raise HFConversionError(f"{where}: unexpected tensors {', '.join(unexpected[:8])}"
                            + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else "")
                            + f" (a {config.model.position} model of this config.json has no such parameters)")
  by_path = {path: name for name, path in names.items()}
  dtype = np.dtype(spec.param_dtype)

  def fill(path, leaf):
    key = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
    name = by_path[key]
    x = np.asarray(tensors[name])
    want = _expected_hf_shape(key, leaf.shape)
    if x.shape != want:
      raise HFConversionError(f"{where}: tensor {name} has shape {list(x.shape)}, config.json implies {list(want)}")
    return jax.numpy.asarray(_from_hf(key, x.astype(dtype), leaf.shape))

  params = jax.tree_util.tree_map_with_path(fill, abstract_params)
  return nnx.merge(graphdef, params)


# --------------------------------------------------------------------------- files


def _read_json(path: str) -> dict:
  try:
    with open(path) as f:
      value = json.load(f)
  except json.JSONDecodeError as e:
    raise HFConversionError(f"{path} is not valid JSON: {e}") from e
  if not isinstance(value, dict):
    raise HFConversionError(f"{path} must hold a JSON object")
  return value


def read_config(hf_dir: str) -> dict:
  """``hf_dir/config.json`` as a dict; refuses a missing directory or file."""
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf {hf_dir} does not exist (a local directory with config.json and "
                            f"{WEIGHTS} is needed; nothing is downloaded)")
  path = os.path.join(hf_dir, CONFIG)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{hf_dir} has no {CONFIG}: not a Hugging Face model directory")
  return _read_json(path)


def load_safetensors(hf_dir: str) -> dict[str, np.ndarray]:
  """All tensors of ``hf_dir``: ``model.safetensors``, or the shards named by ``model.safetensors.index.json``."""
  from safetensors import safe_open

  index = os.path.join(hf_dir, INDEX)
  if os.path.exists(index):
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise HFConversionError(f"{index} has no weight_map")
    files = sorted(set(weight_map.values()))
  elif os.path.exists(os.path.join(hf_dir, WEIGHTS)):
    weight_map, files = None, [WEIGHTS]
  else:
    others = [f for f in os.listdir(hf_dir) if f.endswith((".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack"))]
    hint = f"; found {', '.join(sorted(others))}: convert to safetensors first" if others else ""
    raise FileNotFoundError(f"{hf_dir} has neither {WEIGHTS} nor {INDEX} (only safetensors weights are read){hint}")
  tensors: dict[str, np.ndarray] = {}
  for name in files:
    path = os.path.join(hf_dir, name)
    if not os.path.exists(path):
      raise FileNotFoundError(f"{path} is listed in {INDEX} but missing")
    try:
      with safe_open(path, framework="numpy") as f:
        for key in f.keys():
          if weight_map is not None and weight_map.get(key) != name:
            raise HFConversionError(f"{path} holds {key}, which {INDEX} places in {weight_map.get(key)!r}")
          tensors[key] = f.get_tensor(key)
    except HFConversionError:
      raise
    except Exception as e:  # safetensors raises its own error types for truncated or foreign files
      raise HFConversionError(f"{path} cannot be read as safetensors: {e}") from e
  if weight_map is not None:
    absent = sorted(set(weight_map) - set(tensors))
    if absent:
      raise HFConversionError(f"{INDEX} lists {', '.join(absent[:8])} but the shards do not hold them")
  return tensors


def load_hf(hf_dir: str, *, seq_len: int) -> tuple[ml_collections.ConfigDict, model_lib.Decoder, dict]:
  """``(config, model, hf_config)`` of a local Llama / Mistral / Qwen2 checkpoint (float32 parameters)."""
  hf = read_config(hf_dir)
  config = config_from_hf(hf, seq_len=seq_len, where=os.path.join(hf_dir, CONFIG))
  model = params_from_hf(load_safetensors(hf_dir), config, where=hf_dir)
  return config, model, hf


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


def export(config: ml_collections.ConfigDict, model: model_lib.Decoder, out: str) -> dict:
  """Write ``config.json``, ``model.safetensors`` and the byte-level tokenizer of one of our runs into ``out``.

  Written to a temporary sibling and renamed into place; an ``out`` that holds
  anything but a previous export is refused rather than replaced. Returns the
  HF config.
  """
  from safetensors.numpy import save_file

  hf = config_to_hf(config)  # refuses nope / learned / mixed patterns before anything is written
  if os.path.exists(out) and (not os.path.isdir(out) or (os.listdir(out) and not os.path.exists(
      os.path.join(out, CONFIG)))):
    raise FileExistsError(f"--out {out} exists and is not a previous export (no {CONFIG}); choose another --out")
  with atomic.directory(out, ".export-") as tmp:
    with open(os.path.join(tmp, CONFIG), "w") as f:
      json.dump(hf, f, indent=1)
    save_file(params_to_hf(model), os.path.join(tmp, WEIGHTS), metadata={"format": "pt"})
    if model.spec.vocab_size == VOCAB_SIZE:
      write_byte_tokenizer(tmp, add_bos=config.data.bos == "prepend", max_len=hf["max_position_embeddings"])
  return hf


# --------------------------------------------------------------------------- tokenizer and analysis texts


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
  tc = _read_json(tc_path) if os.path.exists(tc_path) else {}
  gc_path = os.path.join(hf_dir, GENERATION_CONFIG)
  gc = _read_json(gc_path) if os.path.exists(gc_path) else {}
  plain = tok.encode("a", add_special_tokens=False).ids
  special = tok.encode("a", add_special_tokens=True).ids
  leading = special[0] if len(special) > len(plain) and special[1:len(plain) + 1] == plain else None
  bos_id = _first(leading, _token_id(tok, tc.get("bos_token")), _int_or_none(gc.get("bos_token_id")),
                  _int_or_none(hf.get("bos_token_id")))
  eos_id = _first(_token_id(tok, tc.get("eos_token")), _int_or_none(gc.get("eos_token_id")),
                  _int_or_none(hf.get("eos_token_id")))
  if isinstance(tc.get("add_bos_token"), bool):
    adds, source = tc["add_bos_token"] and bos_id is not None, f"{TOKENIZER_CONFIG} add_bos_token"
  else:
    adds, source = leading is not None, f"{TOKENIZER} post-processor"
  return BosConvention(bos_id=bos_id, adds=adds, eos_id=eos_id, source=source)


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
