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
- Files: :class:`Checkpoint` (a directory or a GGUF file, read step by step:
  config, tokenizer, weights; GGUF through :mod:`abspos_jax.interop.gguf`),
  :func:`load_safetensors` (``model.safetensors`` or the shards listed in
  ``model.safetensors.index.json``), :func:`export` (``config.json``,
  ``model.safetensors`` and a byte-level ``tokenizer.json``) and
  :func:`load_hf`.
- Analysis texts: :func:`load_tokenizer`, :func:`bos_convention` and
  :func:`analysis_sequences` (the checkpoint's own tokenizer, offline).

Modules: ``common`` (file names, the error), ``config_map`` (config, both
ways), ``weights`` (the parameter table, both ways; safetensors files),
``texts`` (tokenizers and analysis texts), ``files`` (load and export a
directory); everything is importable from here.

Needs ``safetensors`` and ``tokenizers`` (the ``.[hf]`` extra), imported
inside the functions so that the core package never needs them; transformers
and torch are only used by the tests, to check parity.
"""

from abspos_jax.interop.hf.common import (CONFIG, GENERATION_CONFIG, INDEX, TOKENIZER, TOKENIZER_CONFIG, WEIGHTS,
                                          HFConversionError)
from abspos_jax.interop.hf.config_map import ARCHITECTURES, config_from_hf, config_to_hf, export_family
from abspos_jax.interop.hf.files import Checkpoint, export, load_hf, read_config
from abspos_jax.interop.hf.texts import (BosConvention, analysis_sequences, bos_convention, byte_tokenizer,
                                         choose_special_tokens, load_tokenizer, token_id, token_stream,
                                         write_byte_tokenizer)
from abspos_jax.interop.hf.weights import load_safetensors, params_from_hf, params_to_hf

__all__ = ["ARCHITECTURES", "CONFIG", "GENERATION_CONFIG", "INDEX", "TOKENIZER", "TOKENIZER_CONFIG", "WEIGHTS",
           "BosConvention", "Checkpoint", "HFConversionError", "analysis_sequences", "bos_convention",
           "byte_tokenizer", "choose_special_tokens", "config_from_hf", "config_to_hf", "export", "export_family",
           "load_hf", "load_safetensors", "load_tokenizer", "params_from_hf", "params_to_hf", "read_config",
           "token_id", "token_stream", "write_byte_tokenizer"]
