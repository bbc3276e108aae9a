r"""Sweeps: a family of runs (a base config x the Cartesian product of varied fields) from one file.

    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=local
    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=print
    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=slurm \
        [--dry_run] [--only=rope-L2] [--sweep.overrides.train.steps=600]

A sweep file is an ml_collections Python file whose ``get_config()`` returns
(usually starting from :func:`sweep_defaults`):

- ``base``: a config file relative to the repository root, e.g. ``"configs/base.py"``;
- ``overrides``: fields set in every run, nested like ``configs/base.py``
  (``{"train": {"steps": 300}}`` sets ``train.steps``);
- ``vary``: ``((field, (values...)), ...)``; the runs are the Cartesian product,
  the first field outermost (a field also in ``overrides`` takes its values from here);
- ``analyze``: ``enabled`` and the ``analyze.py`` flags of each run
  (``num_sequences``, ``skip_interventions``, ``batch_size``, ``memory_budget_gb``, ``split``, ``seq_len``);
- ``seeds_together``: train the runs that differ only in ``train.seed`` as one
  ``train.py --seeds=...`` command;
- ``slurm``: the options of ``--launch=slurm``.

Everything is checked before anything runs: every field must exist in
``configs/base.py`` and every run's config must pass ``config.validate``.
Run ``k`` of the product works in ``ROOT/<name>``, the name built from the
varied values only (``rope-L2-s0``, see :func:`run_name`).
"""

import dataclasses
import difflib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from abspos_jax import atomic
from abspos_jax import config as config_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHES = ("local", "print", "slurm")
SEED_FIELD = "train.seed"
# Varied field -> prefix of its value in run names ("" : the value alone); others get "<last component>=".
SHORT_NAMES = {
    "model.position": "", "model.num_layers": "L", "train.seed": "s", "model.d_model": "d", "data.seq_len": "T",
    "train.learning_rate": "lr", "train.weight_decay": "wd", "model.window": "W", "model.num_heads": "H",
}
# analyze.py flags a sweep may set per run (workdir, step and out are the sweep's to choose).
ANALYZE_FLAGS = ("num_sequences", "skip_interventions", "batch_size", "memory_budget_gb", "split", "seq_len")
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
  c.analyze = a = ml_collections.ConfigDict()
  a.enabled = True
  a.num_sequences = 256
  a.skip_interventions = False
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


@dataclasses.dataclass(frozen=True)
class Job:
  """One command line: a run, or (``seeds_together``) the runs of one configuration over its seeds.

  ``label`` is the run name, or the group's name with the seed as ``{seed}``.
  """
  label: str
  runs: tuple[Run, ...]
  train_argv: tuple[str, ...]
  analyze_argvs: tuple[tuple[str, ...], ...]

  def line(self) -> str:
    """The shell line: training, then each run's analysis, joined with ``&&``."""
    return " && ".join(shlex.join(argv) for argv in (self.train_argv, *self.analyze_argvs))


# ---------------------------------------------------------------------------- expansion and names


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


# ---------------------------------------------------------------------------- commands


def cli_value(value: Any) -> str:
  """A value as ``--config.x=`` takes it back (config_flags parses tuples and bools from their repr)."""
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return value if isinstance(value, str) else repr(value)


def _train_argv(sweep: Sweep, workdir: str, fields: dict[str, Any], python: str,
                seeds: Sequence[int] | None = None) -> tuple[str, ...]:
  argv = [python, "train.py", f"--config={sweep.base}", f"--workdir={workdir}"]
  if seeds is not None:
    argv.append("--seeds=" + ",".join(str(s) for s in seeds))
  return tuple(argv + [f"--config.{f}={cli_value(v)}" for f, v in fields.items()])


def _analyze_argv(sweep: Sweep, workdir: str, python: str) -> tuple[str, ...]:
  argv = [python, "analyze.py", f"--workdir={workdir}"]
  for key in ANALYZE_FLAGS:
    value = sweep.analyze.get(key)
    if isinstance(value, bool):
      argv += [f"--{key}"] if value else []
    elif value is not None:
      argv.append(f"--{key}={value}")
  return tuple(argv)


def jobs(sweep: Sweep, root: str, python: str = "python") -> list[Job]:
  """The command lines of a sweep, one per run (or per seed group with ``seeds_together``)."""
  root = os.path.abspath(root)
  analyse = sweep.analyze["enabled"]

  def analyses(runs) -> tuple:
    return tuple(_analyze_argv(sweep, os.path.join(root, r.name), python) for r in runs) if analyse else ()

  if not (sweep.seeds_together and SEED_FIELD in dict(sweep.vary)):
    return [Job(r.name, (r,), _train_argv(sweep, os.path.join(root, r.name), {**sweep.overrides, **r.varied}, python),
                analyses((r,))) for r in sweep.runs]
  groups: dict[tuple, list[Run]] = {}
  for r in sweep.runs:
    key = tuple((f, repr(v)) for f, v in r.varied.items() if f != SEED_FIELD)
    groups.setdefault(key, []).append(r)
  out = []
  for runs in groups.values():
    label = "-".join(SHORT_NAMES[f] + "{seed}" if f == SEED_FIELD else name_part(f, v)
                     for f, v in runs[0].varied.items())
    seeds = [r.varied[SEED_FIELD] for r in runs]
    assert all(label.format(seed=s) == r.name for s, r in zip(seeds, runs)), label
    fields = {**sweep.overrides, **{f: v for f, v in runs[0].varied.items() if f != SEED_FIELD}}
    out.append(Job(label, tuple(runs), _train_argv(sweep, os.path.join(root, label), fields, python, seeds),
                   analyses(runs)))
  return out


def select(all_jobs: list[Job], only: str | None) -> list[Job]:
  """The jobs with ``only`` in their label or in one of their run names."""
  if not only:
    return all_jobs
  chosen = [j for j in all_jobs if only in j.label or any(only in r.name for r in j.runs)]
  if not chosen:
    raise SweepError(f"--only={only!r} matches no run; runs: {', '.join(r.name for j in all_jobs for r in j.runs)}")
  return chosen


def commands_text(selected: list[Job]) -> str:
  """``commands.sh``: line ``k + 1`` is job ``k`` (what slurm array task ``k`` runs); run from the repository root."""
  return "".join(j.line() + "\n" for j in selected)


def sbatch_text(sweep: Sweep, root: str, num_jobs: int, repo: str = REPO) -> str:
  """``sweep.sbatch``: an array job whose task ``k`` runs line ``k + 1`` of ``ROOT/commands.sh``."""
  root = os.path.abspath(root)
  s = sweep.slurm
  array = f"0-{num_jobs - 1}" + (f"%{s['max_parallel']}" if s["max_parallel"] > 0 else "")
  lines = ["#!/bin/bash", f"#SBATCH --job-name=sweep-{os.path.basename(root)}", f"#SBATCH --array={array}",
           f"#SBATCH --output={root}/logs/%A_%a.out"]
  if s["partition"]:
    lines.append(f"#SBATCH --partition={s['partition']}")
  lines += [f"#SBATCH --time={s['time']}", "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={s['cpus_per_task']}"]
  if s["gpus_per_task"] > 0:
    lines.append(f"#SBATCH --gpus-per-task={s['gpus_per_task']}")
  lines += [f"#SBATCH {x}" for x in s["extra"]]
  lines += ["set -euo pipefail", f"cd {shlex.quote(repo)}", *s["setup"],
            f'line=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {shlex.quote(root + "/commands.sh")})',
            'echo "task $SLURM_ARRAY_TASK_ID: $line"', 'eval "$line"']
  return "\n".join(lines) + "\n"


def sweep_json(sweep: Sweep, root: str, sweep_file: str, selected: list[Job]) -> dict:
  """``ROOT/sweep.json``: the resolved sweep, every run, and the command lines written."""
  root = os.path.abspath(root)
  return {"sweep_file": sweep_file, "base": sweep.base, "overrides": sweep.overrides,
          "vary": [[f, list(v)] for f, v in sweep.vary], "analyze": sweep.analyze,
          "seeds_together": sweep.seeds_together,
          "runs": [{"name": r.name, "workdir": os.path.join(root, r.name), "overrides": r.varied} for r in sweep.runs],
          "commands": [j.line() for j in selected]}


# ---------------------------------------------------------------------------- local: skip, resume, analyse


@dataclasses.dataclass(frozen=True)
class RunState:
  """What a run directory holds, read from the file system alone (no JAX, no orbax).

  ``latest_step``: the newest complete checkpoint (orbax names it by its step;
  a save in progress is a ``*.orbax-checkpoint-tmp*`` directory, never a
  step). ``analysed_step``: the ``step`` recorded in ``analysis/summary.json``
  (None when that summary holds older estimators than :data:`ESTIMATORS`, so
  the run is analysed again).
  ``config_diff``: fields where ``config.json`` differs from the sweep's config.
  """
  latest_step: int | None = None
  analysed_step: int | None = None
  config_diff: tuple[str, ...] = ()


def latest_checkpoint_step(workdir: str) -> int | None:
  path = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(path):
    return None
  steps = [int(n) for n in os.listdir(path) if n.isdigit() and os.path.isdir(os.path.join(path, n))]
  return max(steps, default=None)


# summary.json's "estimators" (analysis/run.py): a summary of older estimators counts as not analysed.
ESTIMATORS = "v2"


def analysed_step(workdir: str) -> int | None:
  """The checkpoint step ``analysis/summary.json`` analysed, or None (no summary, damaged, older estimators)."""
  try:
    with open(os.path.join(workdir, "analysis", "summary.json")) as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(summary, dict) or summary.get("estimators") != ESTIMATORS:
    return None
  step = summary.get("meta", {}).get("step", summary.get("step"))
  return step if isinstance(step, int) else None


def read_state(workdir: str, config: ml_collections.ConfigDict) -> RunState:
  differing = ()
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    with open(path) as f:
      differing = tuple(name for name, _, _ in config_lib.diff(json.load(f), config_lib.to_dict(config)))
  return RunState(latest_checkpoint_step(workdir), analysed_step(workdir), differing)


@dataclasses.dataclass(frozen=True)
class Decision:
  """``action``: skip | analyse (trained, not analysed) | train (from scratch) | resume | conflict."""
  action: str
  detail: str = ""


def decide(states: Sequence[RunState], steps: int, analyse: bool) -> Decision:
  """What ``--launch=local`` does with a job whose run directories are in ``states``.

  A run is finished when its latest checkpoint is at ``steps``, analysed when
  its summary records that step. A group is finished only when all its runs are.
  """
  conflicts = sorted({f for s in states for f in s.config_diff})
  if conflicts:
    return Decision("conflict", "its workdir holds a run with a different config (" + ", ".join(conflicts) + ")")
  unfinished = [s for s in states if s.latest_step != steps]
  if unfinished:
    started = [s.latest_step for s in unfinished if s.latest_step]
    return Decision("resume", f"from step {min(started)}") if started else Decision("train")
  if analyse and any(s.analysed_step != steps for s in states):
    return Decision("analyse")
  return Decision("skip", "finished")


Runner = Callable[[Sequence[str], str, dict[str, str]], int]


def run_logged(argv: Sequence[str], log_path: str, env: dict[str, str]) -> int:
  """Run ``argv`` in the repository root with ``env``, appending its output to ``log_path``; its exit status."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  with open(log_path, "a") as log:
    log.write(f"$ {shlex.join(argv)}\n")
    log.flush()
    p = subprocess.Popen(list(argv), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
      return p.wait()
    except KeyboardInterrupt:  # the child got the SIGINT too: let it checkpoint and exit
      p.wait()
      raise


def local_env(root: str) -> dict[str, str]:
  """The environment of local runs: a JAX compilation cache shared by the sweep (``ROOT/jax_cache``).

  Runs that differ only in their seed compile the same programs, so all but the
  first of them load their train, eval and analysis steps from the cache (on
  2 CPU cores this cut a tiny model's training process from 19 s to 12 s of CPU
  time). A cache the environment already names is kept.
  """
  env = dict(os.environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(root, "jax_cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env


def _local(argv: Sequence[str]) -> list[str]:
  return [sys.executable, *argv[1:]]


def run_local(sweep: Sweep, selected: list[Job], root: str, *, runner: Runner = run_logged,
              compare: Callable[[list[str], str], Any] | None = None, dry_run: bool = False,
              echo: Callable[[str], None] = print) -> list[str]:
  """Run the jobs one after another, skipping finished ones; analyse each when it finishes.

  Returns the failures (``"name: why"``); a failure does not stop the sweep.
  Afterwards, with analysis enabled, ``compare`` (default
  ``abspos_jax.analysis.compare.compare``) runs over every analysed run of the
  sweep into ``ROOT/comparison``.
  """
  root = os.path.abspath(root)
  analyse = sweep.analyze["enabled"]
  env = local_env(root)
  failures = []
  for k, job in enumerate(selected, 1):
    steps = job.runs[0].config.train.steps  # train.steps may be varied, but not within a seed group
    prefix = f"[{k}/{len(selected)}] {job.label}:"
    workdirs = [os.path.join(root, r.name) for r in job.runs]
    states = [read_state(w, r.config) for w, r in zip(workdirs, job.runs)]
    d = decide(states, steps, analyse)
    if d.action == "conflict":
      failures.append(f"{job.label}: {d.detail}")
      echo(f"{prefix} FAILED: {d.detail}")
      continue
    if d.action == "skip":
      echo(f"{prefix} skipped ({d.detail})")
      continue
    if dry_run:
      echo(f"{prefix} would {d.action}" + (f" {d.detail}" if d.detail else "") +
           (", then analyse" if analyse and d.action != "analyse" else ""))
      continue
    done = []
    if d.action in ("train", "resume"):
      log = (os.path.join(workdirs[0], "train.log") if len(workdirs) == 1 else
             os.path.join(root, "logs", job.label.format(seed="_".join(str(r.varied[SEED_FIELD]) for r in job.runs))
                          + ".train.log"))
      start = time.perf_counter()
      rc = runner(_local(job.train_argv), log, env)
      if rc:
        failures.append(f"{job.label}: training exited with status {rc} (log: {log})")
        echo(f"{prefix} FAILED: training exited with status {rc}, see {log}")
        continue
      states = [read_state(w, r.config) for w, r in zip(workdirs, job.runs)]
      short = [f"{r.name} at step {s.latest_step}" for r, s in zip(job.runs, states) if s.latest_step != steps]
      if short:
        failures.append(f"{job.label}: training stopped before step {steps} ({', '.join(short)}); rerun to go on")
        echo(f"{prefix} stopped before step {steps} ({', '.join(short)}); rerun to go on")
        continue
      done.append((f"resumed {d.detail}, " if d.action == "resume" else "") +
                  f"trained ({time.perf_counter() - start:.0f} s)")
    if analyse:
      start = time.perf_counter()
      failed = None
      for w, argv, s in zip(workdirs, job.analyze_argvs, states):
        if s.analysed_step == steps:
          continue
        log = os.path.join(w, "analyze.log")
        rc = runner(_local(argv), log, env)
        if rc or analysed_step(w) != steps:
          failed = f"analysis of {os.path.basename(w)} exited with status {rc}, see {log}"
          break
      if failed:
        failures.append(f"{job.label}: {failed}")
        echo(f"{prefix} {', '.join(done + ['FAILED: ' + failed])}")
        continue
      done.append(f"analysed ({time.perf_counter() - start:.0f} s)")
    echo(f"{prefix} {', '.join(done)}")
  if analyse and not dry_run:
    analysed = [os.path.join(root, r.name) for r in sweep.runs
                if analysed_step(os.path.join(root, r.name)) == r.config.train.steps]
    if analysed:
      if compare is None:
        from abspos_jax.analysis.compare import compare
      out = os.path.join(root, "comparison")
      try:
        compare(analysed, out)
        echo(f"comparison of {len(analysed)} analysed runs: {out}/comparison.md")
      except Exception as e:  # a report problem must not hide the runs' results
        failures.append(f"comparison: {type(e).__name__}: {e}")
  return failures


# ---------------------------------------------------------------------------- command line


def execute(cfg: ml_collections.ConfigDict, root: str, launch: str, *, sweep_file: str = "", only: str | None = None,
            dry_run: bool = False, python: str = "python", runner: Runner = run_logged,
            compare: Callable[[list[str], str], Any] | None = None, echo: Callable[[str], None] = print) -> list[str]:
  """Everything ``python -m abspos_jax.sweep`` does; returns the failures (local only)."""
  if launch not in LAUNCHES:
    raise SweepError(f"--launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
  sweep = expand(cfg)
  selected = select(jobs(sweep, root, python), only)
  root = os.path.abspath(root)
  commands = commands_text(selected)
  if not dry_run:
    os.makedirs(os.path.join(root, "logs"), exist_ok=True)
    atomic.write_json(os.path.join(root, "sweep.json"), sweep_json(sweep, root, sweep_file, selected))
    with open(os.path.join(root, "commands.sh"), "w") as f:
      f.write(commands)
  n_runs = sum(len(j.runs) for j in selected)
  if launch == "print":
    echo(commands.rstrip("\n"))
    where = "(dry run: nothing written)" if dry_run else f"written to {root}/commands.sh"
    echo(f"# {len(selected)} commands for {n_runs} runs, {where}; run each from {REPO}")
  elif launch == "slurm":
    script = sbatch_text(sweep, root, len(selected))
    if dry_run:
      echo(script.rstrip("\n"))
      echo(f"# dry run: nothing written ({len(selected)} array tasks)")
    else:
      path = os.path.join(root, "sweep.sbatch")
      with open(path, "w") as f:
        f.write(script)
      echo(f"wrote {path}: an array of {len(selected)} tasks, task k runs line k+1 of {root}/commands.sh")
      echo(f"submit:  sbatch {path}")
      echo(f"rerun some tasks (e.g. failed ones):  sbatch --array=3,7 {path}")
  else:
    echo(f"{len(selected)} jobs ({n_runs} runs) in {root}" + (" (dry run)" if dry_run else ""))
    return run_local(sweep, selected, root, runner=runner, compare=compare, dry_run=dry_run, echo=echo)
  return []


def main() -> None:
  # Flags are defined here, not at import: sweep files import this module for
  # `sweep_defaults`, and a second definition of the flags would collide.
  from absl import app, flags
  from ml_collections import config_flags

  sweep_flag = config_flags.DEFINE_config_file("sweep", None, "Sweep file (ml_collections).", lock_config=True)
  root = flags.DEFINE_string("root", None, "Directory of the sweep: ROOT/<run name> per run.", required=True)
  launch = flags.DEFINE_enum("launch", "local", LAUNCHES, "local: run here; print: write commands.sh; "
                             "slurm: write an array-job script.")
  dry_run = flags.DEFINE_bool("dry_run", False, "Say what would run; write and run nothing.")
  only = flags.DEFINE_string("only", None, "Only the runs whose name contains this string (with seeds_together: "
                             "their whole seed groups).")
  python = flags.DEFINE_string("python", "python", "Interpreter named in commands.sh (local runs use this one's).")

  def run(argv):
    if len(argv) > 1:
      sys.exit(f"error: unexpected arguments {argv[1:]}")
    if sweep_flag.value is None:
      sys.exit("error: --sweep=FILE is required, e.g. --sweep=configs/sweeps/paper.py")
    try:
      failures = execute(sweep_flag.value, root.value, launch.value, sweep_file=flags.FLAGS["sweep"].config_filename,
                         only=only.value, dry_run=dry_run.value, python=python.value)
    except (SweepError, config_lib.ConfigError) as e:
      sys.exit(f"error: {e}")
    except KeyboardInterrupt:
      sys.exit("interrupted: rerun the same command to resume (finished runs are skipped)")
    if failures:
      sys.exit(f"{len(failures)} failed:\n" + "\n".join(f"  {f}" for f in failures))

  app.run(run)


if __name__ == "__main__":
  main()
