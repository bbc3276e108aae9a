"""What a run directory holds (read from the file system, without restoring anything) and what to do with it."""

import dataclasses
from collections.abc import Sequence

import ml_collections

from abspos_jax import checkpoint, storage
from abspos_jax.analysis.outputs import schema
from abspos_jax import config as config_lib


@dataclasses.dataclass(frozen=True)
class RunState:
  """What a run directory holds, read from the file system alone (no JAX, no orbax).

  ``latest_step``: the newest complete checkpoint (orbax names it by its step;
  a save in progress is a ``*.orbax-checkpoint-tmp*`` directory, never a
  step). ``analysed_step``: the ``step`` recorded in ``analysis/summary.json``
  (None when that summary holds older estimators than :data:`analysis.schema.ESTIMATORS`, so
  the run is analysed again).
  ``config_diff``: fields where ``config.json`` differs from the sweep's config.
  """
  latest_step: int | None = None
  analysed_step: int | None = None
  config_diff: tuple[str, ...] = ()


def latest_checkpoint_step(workdir: str) -> int | None:
  return max(checkpoint.saved_steps(workdir), default=None)


def analysed_step(workdir: str) -> int | None:
  """The checkpoint step ``analysis/summary.json`` analysed, or None (no summary, damaged, older estimators)."""
  try:
    summary = storage.read_json(storage.join(workdir, "analysis", "summary.json"))
  except (OSError, ValueError):
    return None
  if not isinstance(summary, dict) or summary.get("estimators") != schema.ESTIMATORS:
    return None
  step = schema.get(summary, schema.STEP, summary.get("step"))
  return step if isinstance(step, int) else None


def read_state(workdir: str, config: ml_collections.ConfigDict) -> RunState:
  differing = tuple(name for name, _, _ in config_lib.workdir_diff(workdir, config))
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
