"""The command lines of a sweep: one per run (or seed group), ``commands.sh``, ``sweep.json`` and the slurm script."""

import dataclasses
import os
import shlex
from collections.abc import Sequence
from typing import Any

from abspos_jax import storage
from abspos_jax.sweep.spec import ANALYZE_FLAGS, REPO, SEED_FIELD, SHORT_NAMES, Run, Sweep, SweepError, name_part


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
  root = storage.absolute(root)
  analyse = sweep.analyze["enabled"]

  def analyses(runs) -> tuple:
    return tuple(_analyze_argv(sweep, storage.join(root, r.name), python) for r in runs) if analyse else ()

  if not (sweep.seeds_together and SEED_FIELD in dict(sweep.vary)):
    return [Job(r.name, (r,), _train_argv(sweep, storage.join(root, r.name), {**sweep.overrides, **r.varied}, python),
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
    out.append(Job(label, tuple(runs), _train_argv(sweep, storage.join(root, label), fields, python, seeds),
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
  """``sweep.sbatch``: an array job whose task ``k`` runs line ``k + 1`` of ``ROOT/commands.sh``.

  ``root`` is where Slurm reads ``commands.sh`` and writes its logs, so for a
  sweep into object storage it is the local staging directory
  (:func:`abspos_jax.sweep.spec.staging_dir`); the runs still write to the bucket.
  """
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
  root = storage.absolute(root)
  return {"sweep_file": sweep_file, "base": sweep.base, "overrides": sweep.overrides,
          "vary": [[f, list(v)] for f, v in sweep.vary], "analyze": sweep.analyze,
          "seeds_together": sweep.seeds_together,
          "runs": [{"name": r.name, "workdir": storage.join(root, r.name), "overrides": r.varied} for r in sweep.runs],
          "commands": [j.line() for j in selected]}
