"""Weights, both ways: our parameters <-> HF tensors, and reading safetensors files.

:data:`TABLE` lists every parameter once: our path, its HF name and its
:class:`Layout` (HF linear weights are ``[out, in]``, ours ``[in, ...]``);
:func:`params_to_hf` and :func:`params_from_hf` both read it.
"""

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

import jax
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax.interop.hf.common import INDEX, WEIGHTS, HFConversionError, read_json
from abspos_jax.interop.hf.config_map import export_family


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one of our arrays is laid out as an HF tensor: ``to_hf(x)`` and its inverse ``from_hf(x, our_shape)``."""
  to_hf: Callable[[np.ndarray], np.ndarray]
  from_hf: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]


SAME = Layout(lambda x: x, lambda x, shape: x)  # embed [V, D], norm scales [D]
LINEAR = Layout(lambda x: x.T, lambda x, shape: x.T)  # [in, out] <-> [out, in]
QKV = Layout(lambda x: x.reshape(x.shape[0], -1).T,  # [D, heads, d_h] <-> [heads * d_h, D]
             lambda x, shape: x.T.reshape(shape))
OUT = Layout(lambda x: x.reshape(-1, x.shape[-1]).T,  # [H, d_h, D] <-> [D, H * d_h]
             lambda x, shape: x.T.reshape(shape))
BIAS = Layout(lambda x: x.reshape(-1), lambda x, shape: x.reshape(shape))  # [heads, d_h] <-> [heads * d_h]


class Row(NamedTuple):
  """One parameter: our path (dot-separated; ``{l}`` is the layer index), its HF name and its layout.

  ``needs``: the condition under which a model has it (None: always; ``"untied"``:
  ``tie_embeddings`` is off; ``"qkv_bias"``: ``qkv_bias`` is on).
  """
  ours: str
  hf: str
  layout: Layout
  needs: str | None = None


# Every parameter, global rows first, then the rows of one layer, in the order transformers writes them.
TABLE = (
    Row("embed", "model.embed_tokens.weight", SAME),
    Row("final_norm.scale", "model.norm.weight", SAME),
    Row("unembed", "lm_head.weight", LINEAR, "untied"),
    Row("blocks.{l}.attn_norm.scale", "model.layers.{l}.input_layernorm.weight", SAME),
    Row("blocks.{l}.mlp_norm.scale", "model.layers.{l}.post_attention_layernorm.weight", SAME),
    Row("blocks.{l}.attn.wq", "model.layers.{l}.self_attn.q_proj.weight", QKV),
    Row("blocks.{l}.attn.wk", "model.layers.{l}.self_attn.k_proj.weight", QKV),
    Row("blocks.{l}.attn.wv", "model.layers.{l}.self_attn.v_proj.weight", QKV),
    Row("blocks.{l}.attn.wo", "model.layers.{l}.self_attn.o_proj.weight", OUT),
    Row("blocks.{l}.attn.bq", "model.layers.{l}.self_attn.q_proj.bias", BIAS, "qkv_bias"),
    Row("blocks.{l}.attn.bk", "model.layers.{l}.self_attn.k_proj.bias", BIAS, "qkv_bias"),
    Row("blocks.{l}.attn.bv", "model.layers.{l}.self_attn.v_proj.bias", BIAS, "qkv_bias"),
    Row("blocks.{l}.mlp.gate", "model.layers.{l}.mlp.gate_proj.weight", LINEAR),
    Row("blocks.{l}.mlp.up", "model.layers.{l}.mlp.up_proj.weight", LINEAR),
    Row("blocks.{l}.mlp.down", "model.layers.{l}.mlp.down_proj.weight", LINEAR),
)


def _expand(rows: Iterable[Row], num_layers: int) -> dict[str, tuple[tuple, Row]]:
  """HF tensor name -> (our parameter path, its row): the global rows once, the per-layer rows per layer."""
  rows = list(rows)
  out = {r.hf: (tuple(r.ours.split(".")), r) for r in rows if "{l}" not in r.ours}
  for l in range(num_layers):
    for r in rows:
      if "{l}" in r.ours:  # the layer index is an int key of our parameter tree
        out[r.hf.format(l=l)] = (tuple(int(k) if k.isdigit() else k for k in r.ours.format(l=l).split(".")), r)
  return out


def _tensors(spec: model_lib.ModelSpec) -> dict[str, tuple[tuple, Row]]:
  """Every tensor the model of ``spec`` has, as :func:`_expand` gives it."""
  has = {None: True, "untied": not spec.tie_embeddings, "qkv_bias": spec.qkv_bias}
  return _expand((r for r in TABLE if has[r.needs]), spec.num_layers)


def hf_tensor_names(spec: model_lib.ModelSpec) -> list[str]:
  """The HF names of every tensor the model of ``spec`` has."""
  return list(_tensors(spec))


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
  out = {name: np.ascontiguousarray(row.layout.to_hf(flat[path])) for name, (path, row) in _tensors(spec).items()}
  if export_family(spec) == "qwen2" and not spec.qkv_bias:
    dtype = np.dtype(spec.param_dtype)
    for name, (path, _) in _expand((r for r in TABLE if r.needs == "qkv_bias"), spec.num_layers).items():
      heads = spec.num_heads if path[-1] == "bq" else spec.kv_heads
      out[name] = np.zeros(heads * spec.head_dim, dtype)
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
  names = _tensors(spec)
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
  by_path = {path: (name, row.layout) for name, (path, row) in names.items()}
  dtype = np.dtype(spec.param_dtype)

  def fill(path, leaf):
    key = tuple(k.key for k in path if isinstance(k, jax.tree_util.DictKey))
    name, layout = by_path[key]
    x = np.asarray(tensors[name])
    want = layout.to_hf(np.empty(leaf.shape, np.int8)).shape
    if x.shape != want:
      raise HFConversionError(f"{where}: tensor {name} has shape {list(x.shape)}, config.json implies {list(want)}")
    return jax.numpy.asarray(layout.from_hf(x.astype(dtype), leaf.shape))

  params = jax.tree_util.tree_map_with_path(fill, abstract_params)
  return nnx.merge(graphdef, params)


def load_safetensors(hf_dir: str) -> dict[str, np.ndarray]:
  """All tensors of ``hf_dir``: ``model.safetensors``, or the shards named by ``model.safetensors.index.json``."""
  from safetensors import safe_open

  index = os.path.join(hf_dir, INDEX)
  if os.path.exists(index):
    weight_map = read_json(index).get("weight_map")
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
