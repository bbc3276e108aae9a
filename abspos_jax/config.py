"""Config loading, validation and comparison.

Configs are ml_collections ``ConfigDict`` files (see ``configs/``). Everything
is checked here, before a device is touched or anything compiles, and every
error names the field and what is allowed.
"""

import dataclasses
import functools
import importlib.util
import json
import os
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import ml_collections

from abspos_jax import storage
from abspos_jax.attention_kernels import IMPLS as ATTENTION_IMPLS  # noqa: F401 (configs/base.py takes it from here)
from abspos_jax.model import POSITIONS  # noqa: F401 (configs/base.py takes it from here)

BOS_POLICIES = ("prepend", "none")
MESH_AXES = ("data", "fsdp", "tensor")
DTYPES = ("float32", "bfloat16")
NONFINITE_POLICIES = ("stop", "skip")

class ConfigError(ValueError):
  """A config field holds a value that is not allowed."""


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field, declared once in ``configs/base.py``.

  ``name``: dotted (``"model.d_model"``); ``default``; ``doc``: one line.
  Checks of the value alone: ``choices`` (allowed values), ``at_least``
  (``value >= at_least``), ``above`` (``value > above``), ``why`` (said
  after a failed bound); a bool default admits only True and False.
  ``resumable``: a resumed run may change it (it changes how the run is
  observed or laid out, not what it computes). ``key``: README lists it.
  """
  name: str
  default: Any
  doc: str
  choices: tuple = ()
  at_least: float | None = None
  above: float | None = None
  why: str = ""
  resumable: bool = False
  key: bool = False

  def check(self, value: Any) -> None:
    """Raise :class:`ConfigError` naming the field when ``value`` fails this field's own checks."""
    if isinstance(self.default, bool) and not isinstance(value, bool):
      _fail(self.name, "must be True or False", value)
    if self.choices and value not in self.choices:
      _fail(self.name, f"must be one of {', '.join(map(str, self.choices))}", value)
    why = f" ({self.why})" if self.why else ""
    if self.at_least is not None and value < self.at_least:
      _fail(self.name, f"must be >= {self.at_least:g}{why}", value)
    if self.above is not None and not value > self.above:
      _fail(self.name, f"must be > {self.above:g}{why}", value)


def build(fields: Sequence[Field]) -> ml_collections.ConfigDict:
  """The ConfigDict of ``fields``' defaults, nested by their dotted names."""
  c = ml_collections.ConfigDict()
  for f in fields:
    *path, leaf = f.name.split(".")
    node = c
    for key in path:
      if key not in node:
        node[key] = ml_collections.ConfigDict()
      node = node[key]
    node[leaf] = f.default
  return c


@functools.cache
def _base_module() -> ModuleType:
  return _load_module(os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "base.py"))


def base_fields() -> dict[str, Field]:
  """``configs/base.py``'s declarations by name."""
  return {f.name: f for f in _base_module().FIELDS}


def base_config() -> ml_collections.ConfigDict:
  """``configs/base.py``: the full set of known fields with their defaults (a fresh copy)."""
  return _base_module().get_config()


def resumable_fields() -> tuple[str, ...]:
  """Fields that may change between a run and its resumption (``resumable=True`` in ``configs/base.py``)."""
  return tuple(name for name, f in base_fields().items() if f.resumable)


def _load_module(path: str) -> ModuleType:
  spec = importlib.util.spec_from_file_location("abspos_config", path)
  if spec is None or spec.loader is None:
    raise ConfigError(f"cannot load config file {path!r}")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config_file(path: str) -> ml_collections.ConfigDict:
  """Run ``get_config()`` of a Python config file."""
  return _load_module(path).get_config()


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
  known = base_fields()
  for name, value in flatten(config):
    if name not in known:
      raise ConfigError(f"unknown config field config.{name}; known fields: " + ", ".join(sorted(known)))
    known[name].check(value)
  _validate_model(config.model, config.data)
  _validate_data(config.data)
  _validate_train(config.train, config.checkpoint)
  dp = data_parallel_size(dict(zip(config.mesh.axes, resolve_mesh_shape(config, num_devices))), config.mesh.rules)
  micro = config.train.batch_size // config.train.grad_accum
  if micro % dp:
    _fail("train.batch_size", f"must split into train.grad_accum={config.train.grad_accum} micro-batches each "
          f"divisible by the data-parallel size {dp} (mesh.rules 'batch' over mesh.axes={tuple(config.mesh.axes)})",
          config.train.batch_size)


def data_parallel_size(mesh_sizes: dict[str, int], rules) -> int:
  """How many ways the batch is split: the product of the sizes of the mesh axes that ``rules`` maps the
  logical ``batch`` axis to (those absent from the mesh do not count), as ``sharding.batch_sharding`` does."""
  target = dict(rules).get("batch")
  targets = (target,) if isinstance(target, str) else tuple(target or ())
  n = 1
  for axis in dict.fromkeys(targets):
    n *= mesh_sizes.get(axis, 1)
  return n


def _validate_model(m: ml_collections.ConfigDict, d: ml_collections.ConfigDict) -> None:
  if m.d_model % m.num_heads:
    _fail("model.num_heads", f"must divide model.d_model={m.d_model}", m.num_heads)
  head_dim = m.d_model // m.num_heads
  if m.position in ("rope", "ntk", "swa") and head_dim % 2:
    _fail("model.num_heads", f"must leave an even head dimension for RoPE (d_model/num_heads={head_dim})",
          m.num_heads)
  if m.num_kv_heads < 0 or (m.num_kv_heads and m.num_heads % m.num_kv_heads):
    _fail("model.num_kv_heads", f"must be 0 (= num_heads) or divide model.num_heads={m.num_heads}", m.num_kv_heads)
  if m.position == "ntk" and head_dim <= 2:
    _fail("model.num_heads", f"must leave a head dimension > 2 for NTK scaling (got d_h={head_dim})", m.num_heads)
  if set(m.layer_pattern) - set("LG"):
    _fail("model.layer_pattern", "may only hold L (local) and G (global), e.g. 'LLG'", m.layer_pattern)
  if m.position == "learned" and m.max_len and m.max_len < d.seq_len:
    _fail("model.max_len", f"must be >= data.seq_len={d.seq_len} for learned positions", m.max_len)


def _validate_data(d: ml_collections.ConfigDict) -> None:
  if not d.name:
    _fail("data.name", "must name a dataset (stdlib_text, stdlib_prose, text_files, synthetic, backcopy or a TFDS "
          "dataset)", d.name)
  if d.name == "text_files" and not d.files.strip():
    _fail("data.files", "must list paths or globs (comma-separated) when data.name='text_files'", d.files)
  if d.name in ("synthetic", "backcopy"):
    _validate_language(d)


def _validate_train(t: ml_collections.ConfigDict, k: ml_collections.ConfigDict) -> None:
  if not 0 <= t.seed < 2**32:
    _fail("train.seed", "must be in [0, 2**32)", t.seed)
  if t.batch_size % t.grad_accum:
    _fail("train.grad_accum", f"must divide train.batch_size={t.batch_size}", t.grad_accum)
  if k.keep_period < 0 or k.keep_period % k.every:
    _fail("checkpoint.keep_period", f"must be 0 (off) or a positive multiple of checkpoint.every={k.every} "
          "(only saved steps can be kept)", k.keep_period)


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
  path = storage.join(workdir, "config.json")
  if not storage.path(path).exists():
    return []
  return diff(storage.read_json(path), to_dict(config))


def diff(stored: dict, current: dict) -> list[tuple[str, Any, Any]]:
  """Fields (outside :func:`resumable_fields`) whose values differ: ``[(field, stored, current)]``.

  A field that ``stored`` lacks (it was added to ``configs/base.py`` after that
  run was saved) counts as its base default, which keeps the old behaviour.
  """
  a, b = dict(flatten(_normalise(stored))), dict(flatten(_normalise(current)))
  defaults = dict(flatten(to_dict(base_config())))
  a = {**{name: defaults[name] for name in b if name not in a and name in defaults}, **a}
  resumable = resumable_fields()
  return [(name, a.get(name), b.get(name)) for name in sorted(set(a) | set(b))
          if name not in resumable and a.get(name) != b.get(name)]


# --------------------------------------------------------------------------- docs from the declarations

README_BEGIN = "<!-- key fields: generated from configs/base.py by `python -m abspos_jax.config` -->"
README_END = "<!-- /key fields -->"


def key_fields_text() -> str:
  """README's list of key fields (``key=True``), with their allowed values."""
  parts = [f"`{f.name}`" + (f" ({' | '.join(map(str, f.choices))})" if f.choices else "")
           for f in base_fields().values() if f.key]
  return "Key fields: " + ", ".join(parts) + ". Every field: [`docs/config.md`](docs/config.md)."


def fields_markdown() -> str:
  """docs/config.md: every field with its default, what it is, its checks and whether a resume may change it."""
  lines = ["# Config fields", "", "Generated from the declarations in `configs/base.py` by "
           "`python -m abspos_jax.config` (`tests/test_config.py` checks it is current). Checks that involve "
           "several fields are in `abspos_jax/config.py::validate`. *Resumable*: a resumed run may change it.", "",
           "| field | default | what | allowed | resumable |", "|---|---|---|---|---|"]
  for f in base_fields().values():
    allowed = [" \\| ".join(map(str, f.choices))] if f.choices else []
    allowed += [f">= {f.at_least:g}"] if f.at_least is not None else []
    allowed += [f"> {f.above:g}"] if f.above is not None else []
    allowed += ["True, False"] if isinstance(f.default, bool) else []
    lines.append(f"| `{f.name}` | `{f.default!r}` | {f.doc.replace('|', chr(92) + '|')} | {'; '.join(allowed)} | "
                 f"{'yes' if f.resumable else ''} |")
  return "\n".join(lines) + "\n"


def replace_between(path: str, begin: str, end: str, text: str) -> None:
  """Rewrite the part of the file ``path`` between the marker lines ``begin`` and ``end`` with ``text``."""
  with open(path) as f:
    old = f.read()
  head, rest = old.split(begin)
  _, tail = rest.split(end)
  with open(path, "w") as f:
    f.write(f"{head}{begin}\n{text}\n{end}{tail}")


def write_docs(repo: str) -> None:
  """Rewrite docs/config.md and README's key-field list from the declarations."""
  with open(os.path.join(repo, "docs", "config.md"), "w") as f:
    f.write(fields_markdown())
  replace_between(os.path.join(repo, "README.md"), README_BEGIN, README_END, key_fields_text())


if __name__ == "__main__":
  write_docs(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
