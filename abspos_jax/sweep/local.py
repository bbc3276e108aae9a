"""``--launch=local``: the jobs one after another here, skipping what is done, resuming what was cut, analysing
each run when it finishes and comparing them all at the end."""

import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from abspos_jax import storage
from abspos_jax.sweep.commands import Job
from abspos_jax.sweep.spec import REPO, SEED_FIELD, Sweep, staging_dir
from abspos_jax.sweep.state import analysed_step, decide, read_state


Runner = Callable[[Sequence[str], str, dict[str, str]], int]


def run_logged(argv: Sequence[str], log_path: str, env: dict[str, str]) -> int:
  """Run ``argv`` in the repository root with ``env``, appending its output to ``log_path``; its exit status.

  A log in object storage is written to a local file while the command runs
  and appended to the object (one upload) when it ends, however it ends.
  """
  if storage.is_remote(log_path):
    with tempfile.TemporaryDirectory() as d:
      local = os.path.join(d, "log")
      try:
        return run_logged(argv, local, env)
      finally:
        previous = storage.read_text(log_path) if storage.path(log_path).exists() else ""
        with open(local) as f:
          storage.write_text(log_path, previous + f.read())
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
  """The environment of local runs: a JAX compilation cache shared by the sweep (``ROOT/jax_cache``, local:
  :func:`~abspos_jax.sweep.spec.staging_dir`).

  Runs that differ only in their seed compile the same programs, so all but the
  first of them load their train, eval and analysis steps from the cache (on
  2 CPU cores this cut a tiny model's training process from 19 s to 12 s of CPU
  time). A cache the environment already names is kept.
  """
  env = dict(os.environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(staging_dir(root), "jax_cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env


def _local(argv: Sequence[str]) -> list[str]:
  return [sys.executable, *argv[1:]]


def _train(job: Job, workdirs: list[str], root: str, steps: int, runner: Runner, env: dict[str, str]) -> str | None:
  """Train (or resume) a job; None when every run reached ``steps``, else why not."""
  log = (storage.join(workdirs[0], "train.log") if len(workdirs) == 1 else
         os.path.join(staging_dir(root), "logs", job.label.format(seed="_".join(str(r.varied[SEED_FIELD]) for r in job.runs))
                      + ".train.log"))
  rc = runner(_local(job.train_argv), log, env)
  if rc:
    return f"training exited with status {rc}, see {log}"
  short = [f"{r.name} at step {s.latest_step}" for r, s in zip(job.runs, _states(job, workdirs))
           if s.latest_step != steps]
  if short:
    return f"training stopped before step {steps} ({', '.join(short)}); rerun to go on"
  return None


def _analyse(job: Job, workdirs: list[str], steps: int, runner: Runner, env: dict[str, str]) -> str | None:
  """Analyse each run of a job not yet analysed at ``steps``; None on success, else why not."""
  for w, argv, s in zip(workdirs, job.analyze_argvs, _states(job, workdirs)):
    if s.analysed_step == steps:
      continue
    log = storage.join(w, "analyze.log")
    rc = runner(_local(argv), log, env)
    if rc or analysed_step(w) != steps:
      return f"analysis of {storage.name(w)} exited with status {rc}, see {log}"
  return None


def _states(job: Job, workdirs: list[str]) -> list:
  return [read_state(w, r.config) for w, r in zip(workdirs, job.runs)]


def _compare_all(sweep: Sweep, root: str, compare: Callable[[list[str], str], Any] | None,
                 echo: Callable[[str], None]) -> list[str]:
  """``compare`` over every analysed run of the sweep into ``ROOT/comparison``; the failure, if any."""
  analysed = [storage.join(root, r.name) for r in sweep.runs
              if analysed_step(storage.join(root, r.name)) == r.config.train.steps]
  if not analysed:
    return []
  if compare is None:
    from abspos_jax.analysis.outputs.compare import compare
  out = storage.join(root, "comparison")
  try:
    compare(analysed, out)
  except Exception as e:  # a report problem must not hide the runs' results
    return [f"comparison: {type(e).__name__}: {e}"]
  echo(f"comparison of {len(analysed)} analysed runs: {out}/comparison.md")
  return []


def run_local(sweep: Sweep, selected: list[Job], root: str, *, runner: Runner = run_logged,
              compare: Callable[[list[str], str], Any] | None = None, dry_run: bool = False,
              echo: Callable[[str], None] = print) -> list[str]:
  """Run the jobs one after another, skipping finished ones; analyse each when it finishes.

  Returns the failures (``"name: why"``); a failure does not stop the sweep.
  Afterwards, with analysis enabled, ``compare`` (default
  ``abspos_jax.analysis.outputs.compare.compare``) runs over every analysed run of the
  sweep into ``ROOT/comparison``.
  """
  root = storage.absolute(root)
  analyse = sweep.analyze["enabled"]
  env = local_env(root)
  failures = []
  for k, job in enumerate(selected, 1):
    steps = job.runs[0].config.train.steps  # train.steps may be varied, but not within a seed group
    prefix = f"[{k}/{len(selected)}] {job.label}:"
    workdirs = [storage.join(root, r.name) for r in job.runs]
    d = decide(_states(job, workdirs), steps, analyse)
    if d.action in ("conflict", "skip") or dry_run:
      if d.action == "conflict":
        failures.append(f"{job.label}: {d.detail}")
      echo(f"{prefix} " + {"conflict": f"FAILED: {d.detail}", "skip": f"skipped ({d.detail})"}.get(
          d.action, f"would {d.action}" + (f" {d.detail}" if d.detail else "") +
          (", then analyse" if analyse and d.action != "analyse" else "")))
      continue
    done, failed = [], None
    if d.action in ("train", "resume"):
      start = time.perf_counter()
      failed = _train(job, workdirs, root, steps, runner, env)
      done += [] if failed else [(f"resumed {d.detail}, " if d.action == "resume" else "") +
                                 f"trained ({time.perf_counter() - start:.0f} s)"]
    if analyse and not failed:
      start = time.perf_counter()
      failed = _analyse(job, workdirs, steps, runner, env)
      done += [] if failed else [f"analysed ({time.perf_counter() - start:.0f} s)"]
    if failed:
      failures.append(f"{job.label}: {failed}")
    echo(f"{prefix} {', '.join(done + (['FAILED: ' + failed] if failed else []))}")
  if analyse and not dry_run:
    failures += _compare_all(sweep, root, compare, echo)
  return failures
