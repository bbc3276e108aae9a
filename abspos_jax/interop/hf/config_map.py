"""Config, both ways: our config <-> a Llama / Mistral / Qwen2 ``config.json`` (field by field: docs/interop.md)."""

from collections.abc import Iterable, Mapping

import ml_collections

from abspos_jax import config as config_lib
from abspos_jax import model as model_lib
from abspos_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE
from abspos_jax.interop.hf.common import CONFIG, HFConversionError, first, refuse

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

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
    "_name_or_path", "_model_name_or_path", "_commit_hash", "architectures", "model_type", "transformers_version",
    "torch_dtype", "dtype", "use_cache", "initializer_range", "attention_dropout", "embd_pdrop", "resid_pdrop",
    "pretraining_tp", "output_attentions", "output_hidden_states", "return_dict", "use_return_dict", "torchscript",
    "tokenizer_class", "name_or_path", "max_length", "min_length",
    "is_llama_config",  # a marker some nanotron-converted Llama configs carry
})
# Every "*_token_id" (bos, eos, pad, unk, sep, ...) names a token; none changes the forward pass.
_INERT_SUFFIX = "_token_id"
# Fields that are inert at exactly these values and refused otherwise (by the family check or below).
_INERT_VALUES = {"use_mrope": (False, None)}
_ROPE_KEYS = frozenset({"rope_theta", "rope_type", "type", "partial_rotary_factor"})
_DEFAULT_ROPE_THETA = 10000.0  # transformers' default_theta


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
    refuse("export", "model.position", spec.position, why)
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
    refuse(where, field, value, "must be a positive integer")
  return value


def _rope_base(hf: Mapping, where: str) -> float:
  """``rope_theta``, refusing any RoPE variant other than the default (half-split, unscaled)."""
  legacy = hf.get("rope_scaling")
  # transformers >= 5 takes a non-empty legacy rope_scaling over rope_parameters.
  field = "rope_scaling" if legacy else "rope_parameters"
  params = legacy or hf.get("rope_parameters") or {}
  if not isinstance(params, Mapping):
    refuse(where, field, params, "must be a JSON object")
  if params and not set(params) & {"rope_type", "type", "rope_theta"}:
    # Nested per layer type ({"full_attention": {...}, ...}): fine when all are the same.
    nested = list(params.values())
    if not all(isinstance(v, Mapping) for v in nested) or any(v != nested[0] for v in nested):
      refuse(where, field, params, "different RoPE per layer type is not implemented")
    params = nested[0]
  rope_type = params.get("rope_type", params.get("type", "default"))
  if rope_type != "default":
    refuse(where, f"{field}.rope_type", rope_type,
           "only unscaled RoPE ('default') is implemented; scaled variants change the frequencies")
  for key in sorted(set(params) - _ROPE_KEYS):
    refuse(where, f"{field}.{key}", params[key], "not part of default RoPE")
  partial = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
  if partial not in (None, 1, 1.0):
    refuse(where, "partial_rotary_factor", partial, "only full rotation (1.0) is implemented")
  theta = first(params.get("rope_theta"), hf.get("rope_theta"), _DEFAULT_ROPE_THETA)  # null counts as absent
  if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
    refuse(where, f"{field}.rope_theta", theta, "must be a positive number")
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
  use = first(hf.get("use_sliding_window"), False)
  if not isinstance(use, bool):
    refuse(where, "use_sliding_window", use, "must be true or false")
  types = hf.get("layer_types")
  if types is not None:
    if (not isinstance(types, list) or len(types) != num_layers
        or set(types) - {"full_attention", "sliding_attention"}):
      refuse(where, "layer_types", types, f"must list {num_layers} entries of full_attention / sliding_attention")
  if not use:
    if types is not None and "sliding_attention" in types:
      refuse(where, "layer_types", types, "names sliding layers although use_sliding_window is false")
    return None, ""
  window = _positive_int(hf, "sliding_window", where)
  if types is None:
    start = first(hf.get("max_window_layers"), 28)  # Qwen2Config's default
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
      refuse(where, "max_window_layers", start, "must be an integer >= 0")
    types = ["sliding_attention" if l >= start else "full_attention" for l in range(num_layers)]
  if "sliding_attention" not in types:
    return None, ""
  pattern = "".join("L" if t == "sliding_attention" else "G" for t in types)
  return window, "" if "G" not in pattern else pattern


def _shape(hf: Mapping, where: str) -> tuple[int, int, int, int]:
  """``(hidden_size, num_attention_heads, num_hidden_layers, num_key_value_heads)``, checked."""
  d_model = _positive_int(hf, "hidden_size", where)
  num_heads = _positive_int(hf, "num_attention_heads", where)
  num_layers = _positive_int(hf, "num_hidden_layers", where)
  kv_heads = hf.get("num_key_value_heads") or num_heads
  if not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or kv_heads < 1 or num_heads % kv_heads:
    refuse(where, "num_key_value_heads", kv_heads, f"must divide num_attention_heads={num_heads}")
  return d_model, num_heads, num_layers, kv_heads


def _refuse_unreproducible(hf: Mapping, d_model: int, num_heads: int, where: str) -> None:
  """Refuse the fields whose computation our decoder does not have (activation, head size, biases, layout).

  The order is part of the behaviour: a config.json with several problems is
  refused for the first of them (the activation before the head size).
  """
  if first(hf.get("hidden_act"), "silu") not in ("silu", "swish"):
    refuse(where, "hidden_act", hf["hidden_act"], "the MLP is SwiGLU (silu) only")
  if d_model % num_heads:
    refuse(where, "num_attention_heads", num_heads, f"must divide hidden_size={d_model}")
  head_dim = hf.get("head_dim")
  if head_dim is not None and head_dim != d_model // num_heads:
    refuse(where, "head_dim", head_dim, f"our head dimension is hidden_size / num_attention_heads = "
           f"{d_model // num_heads}")
  for field in ("attention_bias", "mlp_bias"):
    if hf.get(field, False):
      refuse(where, field, hf[field], "no biases there (Llama's attention_bias also biases o_proj)")
  if hf.get("rope_interleaved", False):  # nanotron's flag; transformers' Llama always rotates half-split
    refuse(where, "rope_interleaved", hf["rope_interleaved"], "only the half-split RoPE layout is implemented")


def drop_fields(hf: Mapping, ignore: Iterable[str], where: str) -> dict:
  """``hf`` without the fields of ``ignore``; a name the config does not have is refused (a typo would
  otherwise silently ignore nothing)."""
  ignore = set(ignore)
  absent = sorted(ignore - set(hf))
  if absent:
    raise HFConversionError(f"{where}: --hf_ignore_fields names {', '.join(absent)}, which it does not have "
                            f"(its fields: {', '.join(sorted(hf))})")
  return {k: v for k, v in hf.items() if k not in ignore}


def _check_length(hf: Mapping, seq_len: int, context_scale: float, where: str) -> None:
  """Refuse ``seq_len`` past ``max_position_embeddings`` times ``context_scale``."""
  max_pos = hf.get("max_position_embeddings")
  if max_pos is not None and seq_len > max_pos * context_scale:
    extended = f" even extended {context_scale:g} times by the variant" if context_scale != 1 else ""
    refuse(where, "max_position_embeddings", max_pos, f"shorter than the {seq_len} tokens asked for{extended} "
           f"(--rope_scale=ntk:ALPHA analyses ALPHA times the trained context)")


def config_from_hf(hf: Mapping, *, seq_len: int, where: str = CONFIG, ignore: Iterable[str] = (),
                   context_scale: float = 1.0) -> ml_collections.ConfigDict:
  """Our config for a Llama / Mistral / Qwen2 ``config.json`` (a dict), validated.

  ``seq_len`` becomes ``data.seq_len`` (the analysis length). Raises
  :class:`HFConversionError` naming the first field that cannot be reproduced
  exactly, or any field we do not know (it might change the computation).
  Fields that cannot change the computation (metadata, every ``*_token_id``,
  ``torch_dtype``, ...) are accepted as they are published. ``ignore`` (the
  ``--hf_ignore_fields`` escape hatch) drops the named top-level fields first,
  as if the file did not have them: the user's decision, recorded by the caller.
  ``seq_len`` may pass ``max_position_embeddings`` by ``context_scale``, the
  factor by which a context-extension variant stretches it (NTK-aware scaling
  by ``alpha``: ``alpha`` times, :meth:`variants.Variant.context_scale`).
  """
  hf = drop_fields(hf, ignore, where)
  family = hf.get("model_type")
  if family not in ARCHITECTURES:
    refuse(where, "model_type", family, f"supported families: {', '.join(ARCHITECTURES)}")
  archs = hf.get("architectures")
  if archs is not None and archs != [ARCHITECTURES[family]]:
    refuse(where, "architectures", archs, f"only the causal LM {ARCHITECTURES[family]} is supported")
  unknown = sorted(f for f in set(hf) - _COMMON_FIELDS - _FAMILY_FIELDS[family] - _INERT_FIELDS
                   if not f.endswith(_INERT_SUFFIX) and not (f in _INERT_VALUES and hf[f] in _INERT_VALUES[f]))
  if unknown:
    refuse(where, unknown[0], hf[unknown[0]], f"abspos_jax does not know this {family} field "
           f"(unknown fields: {', '.join(unknown)}); refusing rather than guessing what it does")
  d_model, num_heads, num_layers, kv_heads = _shape(hf, where)
  _refuse_unreproducible(hf, d_model, num_heads, where)
  tie = first(hf.get("tie_word_embeddings"), False)
  if not isinstance(tie, bool):
    refuse(where, "tie_word_embeddings", tie, "must be true or false")
  eps = first(hf.get("rms_norm_eps"), 1e-6)  # the default of all three families
  if not isinstance(eps, (int, float)) or eps <= 0:
    refuse(where, "rms_norm_eps", eps, "must be a positive number")
  _check_length(hf, seq_len, context_scale, where)
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
