"""The sweep file: its fields and defaults, their checks, and its expansion into named, validated runs."""

import dataclasses
import difflib
import itertools
import math
import os
import re
from collections.abc import Sequence
from typing import Any

import ml_collections

from abspos_jax import config as config_lib
from abspos_jax import storage
from abspos_jax.analysis import options as analysis_options

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def staging_dir(root: str) -> str:
  """Where a sweep keeps what needs a local disk (process logs, Slurm's script and logs, the compile cache).

  ``root`` itself for a local root; for ``gs://bucket/dir`` it is
  ``STAGING/gs/bucket/dir`` with ``STAGING`` the environment's
  ``ABSPOS_STAGING_DIR``, by default ``REPO/runs/staging`` (on a Slurm cluster
  the repository is on the shared file system the array tasks read).
  """
  return storage.local_staging(root, os.environ.get("ABSPOS_STAGING_DIR", os.path.join(REPO, "runs", "staging")))
SEED_FIELD = "train.seed"
# Varied field -> prefix of its value in run names ("" : the value alone); others get "<last component>=".
SHORT_NAMES = {
    "model.position": "", "model.num_layers": "L", "train.seed": "s", "model.d_model": "d", "data.seq_len": "T",
    "train.learning_rate": "lr", "train.weight_decay": "wd", "model.window": "W", "model.num_heads": "H",
}
# analyze.py flags a sweep may set per run (workdir, step and out are the sweep's to choose): declared with the
# flags themselves (abspos_jax/analysis/options.py).
ANALYZE_FLAGS = analysis_options.sweep_keys()
SLURM_FIELDS = ("partition", "time", "gpus_per_task", "cpus_per_task", "max_parallel", "setup", "extra")
SWEEP_FIELDS = ("base", "overrides", "vary", "analyze", "seeds_together", "slurm")


class SweepError(ValueError):
  """A sweep file or flag holds something that cannot be run."""


def sweep_defaults() -> ml_collections.ConfigDict:
  """Every field a sweep file may set, with its default; sweep files start from this."""
  c = ml_collections.ConfigDict()
  c.base = "configs/base.py"
  c.overrides = ml_collections.ConfigDict()
  c.vary = ()
  c.analyze = analysis_options.sweep_defaults()
  c.seeds_together = False
  c.slurm = s = ml_collections.ConfigDict()
  s.partition = ""  # "": the cluster's default
  s.time = "04:00:00"  # per array task
  s.gpus_per_task = 1
  s.cpus_per_task = 8
  s.max_parallel = 0  # > 0: at most this many tasks at once (--array=0-N%max_parallel)
  s.setup = ("source .venv/bin/activate",)  # shell lines before the command (in the repository root)
  s.extra = ()  # more #SBATCH lines, e.g. ("--mem=64G", "--account=abc")
  return c


@dataclasses.dataclass(frozen=True)
class Run:
  """One run: its directory name, the varied values that define it, its resolved config."""
  name: str
  varied: dict[str, Any]
  config: ml_collections.ConfigDict


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A resolved, validated sweep."""
  base: str
  overrides: dict[str, Any]
  vary: tuple[tuple[str, tuple], ...]
  analyze: dict[str, Any]
  seeds_together: bool
  slurm: dict[str, Any]
  runs: tuple[Run, ...]


def _number(v: float) -> str:
  """The shorter of the plain and the scientific form: 0.003 -> 3e-3, 0.1 -> 0.1, 10000.0 -> 1e4."""
  plain = repr(float(v)).removesuffix(".0")
  mantissa, exponent = f"{v:.14e}".split("e")
  sci = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
  return min(plain, sci, key=len)


def render_value(value: Any) -> str:
  """A value as it appears in a run name: compact and safe as a file name."""
  if isinstance(value, bool):
    s = str(value).lower()
  elif isinstance(value, int):
    s = str(value)
  elif isinstance(value, float):
    s = _number(value)
  elif isinstance(value, (tuple, list)):
    s = "x".join(render_value(v) for v in value) or "empty"
  elif value is None:
    s = "none"
  else:
    s = str(value) or "empty"
  s = re.sub(r"[^A-Za-z0-9._+=-]", "_", s)
  return "_" + s[1:] if s.startswith(".") else s


def name_part(field: str, value: Any) -> str:
  prefix = SHORT_NAMES.get(field, field.rsplit(".", 1)[-1] + "=")
  return prefix + render_value(value)


def run_name(varied: dict[str, Any]) -> str:
  """``rope-L2-s0``: one part per varied field, in the order of ``vary`` (``run`` when nothing varies)."""
  return "-".join(name_part(f, v) for f, v in varied.items()) or "run"


def _known_field(field: Any, known: dict, where: str) -> str:
  if not isinstance(field, str) or field not in known:
    close = difflib.get_close_matches(str(field), known, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else " (see configs/base.py)"
    raise SweepError(f"{where}: {field!r} is not a config field{hint}")
  return field


def _set(config: ml_collections.ConfigDict, field: str, value: Any, where: str) -> None:
  *path, leaf = field.split(".")
  node = config
  for key in path:
    node = node[key]
  try:
    node[leaf] = value
  except (TypeError, ValueError) as e:
    raise SweepError(f"{where}: {field}={value!r} does not fit the field ({e})") from e


def _check_keys(section: ml_collections.ConfigDict, allowed: Sequence[str], where: str) -> None:
  for key in section.keys():
    if key not in allowed:
      raise SweepError(f"{where}.{key} is not a sweep field; allowed: {', '.join(allowed)}")


def _with_defaults(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``cfg`` over :func:`sweep_defaults`, refusing unknown fields (naming them)."""
  _check_keys(cfg, SWEEP_FIELDS, "sweep")
  out = sweep_defaults()
  for key in SWEEP_FIELDS:
    if key not in cfg:
      continue
    if key in ("analyze", "slurm"):
      _check_keys(cfg[key], ("enabled", *ANALYZE_FLAGS) if key == "analyze" else SLURM_FIELDS, f"sweep.{key}")
      for k, v in cfg[key].items():
        try:
          out[key][k] = v
        except TypeError as e:
          raise SweepError(f"sweep.{key}.{k}={v!r} has the wrong type ({e})") from e
    else:
      with out.ignore_type():
        out[key] = cfg[key]
  return out


def _devices(config: ml_collections.ConfigDict) -> int:
  """The device count to validate against: the product of a fully given ``mesh.shape``, else 1."""
  shape = tuple(config.mesh.shape)
  return 1 if -1 in shape else max(1, math.prod(shape))


def expand(cfg: ml_collections.ConfigDict, repo: str = REPO) -> Sweep:
  """Resolve and validate a sweep: every run's config, name and overrides; raise :class:`SweepError`."""
  cfg = _with_defaults(cfg)
  base_path = os.path.join(repo, cfg.base)
  if not cfg.base or not os.path.isfile(base_path):
    raise SweepError(f"sweep.base: {cfg.base!r} is not a config file under {repo}")
  known = dict(config_lib.flatten(config_lib.base_config()))
  overrides = {_known_field(f, known, "sweep.overrides"): v for f, v in config_lib.flatten(cfg.overrides)}
  if not isinstance(cfg.vary, (tuple, list)):
    raise SweepError(f"sweep.vary must be a tuple of (field, (values...)) pairs, got {cfg.vary!r}")
  vary = []
  for i, pair in enumerate(cfg.vary):
    if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[1], (tuple, list))):
      raise SweepError(f"sweep.vary[{i}] must be a (field, (values...)) pair, got {pair!r}")
    field = _known_field(pair[0], known, f"sweep.vary[{i}]")
    if field in dict(vary):
      raise SweepError(f"sweep.vary[{i}]: {field} is varied twice")
    if not pair[1]:
      raise SweepError(f"sweep.vary[{i}]: {field} has no values")
    vary.append((field, tuple(pair[1])))
  if cfg.seeds_together not in (True, False):
    raise SweepError(f"sweep.seeds_together must be True or False, got {cfg.seeds_together!r}")

  # A varied field wins over a fixed one, so `--sweep.vary=...` can vary what the file fixes.
  overrides = {f: v for f, v in overrides.items() if f not in dict(vary)}
  base = config_lib.load_config_file(base_path)
  for field, value in overrides.items():
    _set(base, field, value, "sweep.overrides")
  runs, names = [], {}
  for values in itertools.product(*(v for _, v in vary)):
    varied = dict(zip((f for f, _ in vary), values))
    name = run_name(varied)
    if name in names:
      raise SweepError(f"sweep.vary: runs {names[name]} and {varied} both get the name {name!r}; "
                       f"make the values distinct")
    names[name] = varied
    config = base.copy_and_resolve_references()
    for field, value in varied.items():
      _set(config, field, value, f"sweep.vary {field}")
    try:
      config_lib.validate(config, num_devices=_devices(config))
    except config_lib.ConfigError as e:
      named = dict.fromkeys(f.removeprefix("config.") for f in re.findall(r"[a-z_]+(?:\.[a-z_]+)+", str(e)))
      sources = [f"sweep.vary {f}={varied[f]!r}" for f in named if f in varied]  # the fields the error names
      sources += [f"sweep.overrides {f}={overrides[f]!r}" for f in named if f in overrides]
      raise SweepError(f"run {name} (from {', '.join(sources) or 'sweep.base ' + cfg.base}): {e}") from e
    runs.append(Run(name, varied, config))
  analyze = dict(cfg.analyze.items())
  return Sweep(base=cfg.base, overrides=overrides, vary=tuple(vary), analyze=analyze,
               seeds_together=bool(cfg.seeds_together), slurm=dict(cfg.slurm.items()), runs=tuple(runs))

