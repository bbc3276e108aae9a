"""``python -m abspos_jax.sweep``: expand a sweep file, write its commands, and run, print or submit them."""

import os
import sys
from collections.abc import Callable
from typing import Any

import ml_collections

from abspos_jax import storage
from abspos_jax import config as config_lib
from abspos_jax.sweep.commands import commands_text, jobs, sbatch_text, select, sweep_json
from abspos_jax.sweep.local import Runner, run_local, run_logged
from abspos_jax.sweep.spec import REPO, SweepError, expand, staging_dir

LAUNCHES = ("local", "print", "slurm")


def execute(cfg: ml_collections.ConfigDict, root: str, launch: str, *, sweep_file: str = "", only: str | None = None,
            dry_run: bool = False, python: str = "python", runner: Runner = run_logged,
            compare: Callable[[list[str], str], Any] | None = None, echo: Callable[[str], None] = print) -> list[str]:
  """Everything ``python -m abspos_jax.sweep`` does; returns the failures (local only)."""
  if launch not in LAUNCHES:
    raise SweepError(f"--launch must be one of {', '.join(LAUNCHES)}, got {launch!r}")
  sweep = expand(cfg)
  selected = select(jobs(sweep, root, python), only)
  root = storage.absolute(root)
  local = staging_dir(root)  # logs and Slurm's files need a local disk; the same as root unless root is a URI
  commands = commands_text(selected)
  if not dry_run:
    os.makedirs(os.path.join(local, "logs"), exist_ok=True)
    storage.write_json(storage.join(root, "sweep.json"), sweep_json(sweep, root, sweep_file, selected))
    for where in {root, local}:
      storage.write_text(storage.join(where, "commands.sh"), commands)
  n_runs = sum(len(j.runs) for j in selected)
  if launch == "print":
    echo(commands.rstrip("\n"))
    where = "(dry run: nothing written)" if dry_run else f"written to {root}/commands.sh"
    echo(f"# {len(selected)} commands for {n_runs} runs, {where}; run each from {REPO}")
  elif launch == "slurm":
    script = sbatch_text(sweep, local, len(selected))
    if dry_run:
      echo(script.rstrip("\n"))
      echo(f"# dry run: nothing written ({len(selected)} array tasks)")
    else:
      path = os.path.join(local, "sweep.sbatch")
      storage.write_text(path, script)
      echo(f"wrote {path}: an array of {len(selected)} tasks, task k runs line k+1 of {local}/commands.sh")
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
