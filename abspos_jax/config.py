"""Config loading, validation and comparison.

Configs are ml_collections ``ConfigDict`` files (see ``configs/``). Everything
is checked here, before a device is touched or anything compiles, and every
error names the field and what is allowed.
"""

import importlib.util
import json
import os
from collections.abc import Iterator
from typing import Any

import ml_collections

from abspos_jax.model import POSITIONS

BOS_POLICIES = ("prepend", "none")
MESH_AXES = ("data", "fsdp", "tensor")
DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLS = ("xla", "fused")
NONFINITE_POLICIES = ("stop", "skip")

# Fields that may change between a run and its resumption: they change how a
# run is observed or laid out, not what it computes.
RESUMABLE_FIELDS = (
    "train.log_every", "train.eval_every", "train.progress", "train.peak_flops", "train.stop_at_step", "train.nonfinite",
    "train.emergence", "train.emergence_sequences",
    "checkpoint.every", "checkpoint.keep", "checkpoint.keep_period", "checkpoint.async_save",
    "data.data_dir", "mesh.shape", "mesh.axes", "mesh.rules", "distributed.enabled",
    "distributed.coordinator_address", "distributed.num_processes", "distributed.process_id",
)


class ConfigError(ValueError):
  """A config field holds a value that is not allowed."""


def base_config() -> ml_collections.ConfigDict:
  """``configs/base.py``: the full set of known fields with their defaults."""
  return load_config_file(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "base.py"))


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """Run ``get_config()`` of a Python config file."""
  spec = importlib.util.spec_from_file_location("abspos_config", path)
  if spec is None or spec.loader is None:
    raise ConfigError(f"cannot load config file {path!r}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def flatten(config: ml_collections.ConfigDict | dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """``("model.d_model", 128), ...`` for every leaf field."""
  for key, value in config.items():
    name = f"{prefix}{key}"
    if isinstance(value, (ml_collections.ConfigDict, dict)):
      yield from flatten(value, name + ".")
    else:
      yield name, value


def _normalise(value: Any) -> Any:
  """JSON round trip: tuples become lists, so stored and live configs compare equal."""
  return json.loads(json.dumps(value))


def to_dict(config: ml_collections.ConfigDict) -> dict:
  return _normalise(config.to_dict())


def _fail(field: str, message: str, value: Any) -> None:
  raise ConfigError(f"config.{field} {message}, got {value!r}")


def validate(config: ml_collections.ConfigDict, num_devices: int | None = None) -> None:
  """Refuse unknown fields and invalid values; raise :class:`ConfigError` naming the field.

  ``num_devices`` (default: all devices) checks the mesh and the batch split.
  """
  known = dict(flatten(base_config()))
  for name, value in flatten(config):
    if name not in known:
      raise ConfigError(f"unknown config field config.{name}; known fields: " + ", ".join(sorted(known)))
  m, d, t, k = config.model, config.data, config.train, config.checkpoint
  if m.position not in POSITIONS:
    _fail("model.position", f"must be one of {', '.join(POSITIONS)}", m.position)
  for field in ("num_layers", "d_model", "num_heads", "vocab_size"):
    if m[field] < 1:
      _fail(f"model.{field}", "must be >= 1", m[field])
  if m.d_model % m.num_heads:
    _fail("model.num_heads", f"must divide model.d_model={m.d_model}", m.num_heads)
  head_dim = m.d_model // m.num_heads
  if m.position in ("rope", "ntk", "swa") and head_dim % 2:
    _fail("model.num_heads", f"must leave an even head dimension for RoPE (d_model/num_heads={head_dim})",
          m.num_heads)
  if m.num_kv_heads < 0 or (m.num_kv_heads and m.num_heads % m.num_kv_heads):
    _fail("model.num_kv_heads", f"must be 0 (= num_heads) or divide model.num_heads={m.num_heads}", m.num_kv_heads)
  if not isinstance(m.qkv_bias, bool):
    _fail("model.qkv_bias", "must be True or False", m.qkv_bias)
  if m.norm_eps <= 0:
    _fail("model.norm_eps", "must be > 0", m.norm_eps)
  if m.position == "ntk" and head_dim <= 2:
    _fail("model.num_heads", f"must leave a head dimension > 2 for NTK scaling (got d_h={head_dim})", m.num_heads)
  if m.rope_base <= 0:
    _fail("model.rope_base", "must be > 0", m.rope_base)
  if m.ntk_alpha <= 0:
    _fail("model.ntk_alpha", "must be > 0", m.ntk_alpha)
  if m.window < 1:
    _fail("model.window", "must be >= 1 (keys visible to a query, the query included)", m.window)
  if set(m.layer_pattern) - set("LG"):
    _fail("model.layer_pattern", "may only hold L (local) and G (global), e.g. 'LLG'", m.layer_pattern)
  if m.mlp_dim < 0 or m.max_len < 0:
    _fail("model.mlp_dim" if m.mlp_dim < 0 else "model.max_len", "must be >= 0 (0: derived)",
          min(m.mlp_dim, m.max_len))
  if m.position == "learned" and m.max_len and m.max_len < d.seq_len:
    _fail("model.max_len", f"must be >= data.seq_len={d.seq_len} for learned positions", m.max_len)
  for field, allowed in (("dtype", DTYPES), ("param_dtype", DTYPES), ("attention_impl", ATTENTION_IMPLS)):
    if m[field] not in allowed:
      _fail(f"model.{field}", f"must be one of {', '.join(allowed)}", m[field])
  if d.bos not in BOS_POLICIES:
    _fail("data.bos", f"must be one of {', '.join(BOS_POLICIES)}", d.bos)
  if d.seq_len < 2:
    _fail("data.seq_len", "must be >= 2", d.seq_len)
  if not d.name:
    _fail("data.name", "must name a dataset (stdlib_text, text_files, synthetic, backcopy or a TFDS dataset)", d.name)
  if d.name == "text_files" and not d.files.strip():
    _fail("data.files", "must list paths or globs (comma-separated) when data.name='text_files'", d.files)
  if d.name in ("synthetic", "backcopy"):
    _validate_language(d)
  for field in ("steps", "batch_size", "grad_accum", "log_every", "eval_every"):
    if t[field] < 1:
      _fail(f"train.{field}", "must be >= 1", t[field])
  if not 0 <= t.seed < 2**32:
    _fail("train.seed", "must be in [0, 2**32)", t.seed)
  if t.nonfinite not in NONFINITE_POLICIES:
    _fail("train.nonfinite", f"must be one of {', '.join(NONFINITE_POLICIES)}", t.nonfinite)
  if t.learning_rate <= 0:
    _fail("train.learning_rate", "must be > 0", t.learning_rate)
  if t.warmup_steps < 0:
    _fail("train.warmup_steps", "must be >= 0", t.warmup_steps)
  if t.batch_size % t.grad_accum:
    _fail("train.grad_accum", f"must divide train.batch_size={t.batch_size}", t.grad_accum)
  if not isinstance(t.emergence, bool):
    _fail("train.emergence", "must be True or False", t.emergence)
  if t.emergence_sequences < 2:
    _fail("train.emergence_sequences", "must be >= 2 (the held-out leakage needs two halves)",
          t.emergence_sequences)
  if k.every < 1 or k.keep < 1:
    _fail("checkpoint.every" if k.every < 1 else "checkpoint.keep", "must be >= 1", min(k.every, k.keep))
  if k.keep_period < 0 or k.keep_period % k.every:
    _fail("checkpoint.keep_period", f"must be 0 (off) or a positive multiple of checkpoint.every={k.every} "
          "(only saved steps can be kept)", k.keep_period)
  shape = resolve_mesh_shape(config, num_devices)
  data_parallel = 1
  for axis, size in zip(config.mesh.axes, shape):
    if axis in ("data", "fsdp"):
      data_parallel *= size
  micro = t.batch_size // t.grad_accum
  if micro % data_parallel:
    _fail("train.batch_size", f"must split into train.grad_accum={t.grad_accum} micro-batches each divisible "
          f"by the data-parallel size {data_parallel} (mesh {dict(zip(config.mesh.axes, shape))})", t.batch_size)


def _validate_language(d: ml_collections.ConfigDict) -> None:
  """The knobs of the `synthetic` or `backcopy` language, checked by its own params class."""
  # Late: the data package imports TFDS, which validating other configs does not need.
  from abspos_jax.data import backcopy, synthetic  # pylint: disable=g-import-not-at-top
  if d.synthetic_docs < 1:
    _fail("data.synthetic_docs", "must be >= 1", d.synthetic_docs)
  try:
    (backcopy if d.name == "backcopy" else synthetic).params_from_config(d)
  except ValueError as e:
    raise ConfigError(f"config.{e}") from None


def resolve_mesh_shape(config: ml_collections.ConfigDict, num_devices: int | None = None) -> tuple[int, ...]:
  """``mesh.shape`` with its ``-1`` replaced so the product is the device count."""
  if num_devices is None:
    import jax  # late: validation of everything else must not need a backend
    num_devices = jax.device_count()
  axes, shape = tuple(config.mesh.axes), tuple(config.mesh.shape)
  if len(axes) != len(shape):
    _fail("mesh.shape", f"must have one size per axis of mesh.axes={axes}", shape)
  if len(set(axes)) != len(axes) or set(axes) - set(MESH_AXES):
    _fail("mesh.axes", f"must be distinct names from {', '.join(MESH_AXES)}", axes)
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    _fail("mesh.shape", "must hold positive sizes and at most one -1", shape)
  known = 1
  for s in shape:
    known *= s if s > 0 else 1
  if -1 in shape:
    if num_devices % known:
      _fail("mesh.shape", f"cannot cover {num_devices} devices", shape)
    shape = tuple(num_devices // known if s == -1 else s for s in shape)
  elif known != num_devices:
    _fail("mesh.shape", f"must multiply to the device count {num_devices}", shape)
  return shape


def workdir_diff(workdir: str, config: ml_collections.ConfigDict) -> list[tuple[str, Any, Any]]:
  """:func:`diff` of the run recorded in ``workdir/config.json`` against ``config`` (``[]`` when none is recorded)."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return diff(json.load(f), to_dict(config))


def diff(stored: dict, current: dict) -> list[tuple[str, Any, Any]]:
  """Fields (outside :data:`RESUMABLE_FIELDS`) whose values differ: ``[(field, stored, current)]``.

  A field that ``stored`` lacks (it was added to ``configs/base.py`` after that
  run was saved) counts as its base default, which keeps the old behaviour.
  """
  a, b = dict(flatten(_normalise(stored))), dict(flatten(_normalise(current)))
  defaults = dict(flatten(to_dict(base_config())))
  a = {**{name: defaults[name] for name in b if name not in a and name in defaults}, **a}
  return [(name, a.get(name), b.get(name)) for name in sorted(set(a) | set(b))
          if name not in RESUMABLE_FIELDS and a.get(name) != b.get(name)]
