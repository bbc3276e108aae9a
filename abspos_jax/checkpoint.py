"""Checkpoints: an orbax ``CheckpointManager`` over ``WORKDIR/checkpoints``.

Each step directory holds four items: ``params`` and ``opt_state`` (sharded
arrays; every process writes its shards), ``data`` (the grain iterator state,
JSON) and ``meta`` (step and resolved config, JSON). The iterator state is the
number of global batches consumed, the same in every process whatever their
count, so a checkpoint written by N processes resumes under any other number.
Orbax writes to a temporary directory and renames it when complete (in an
object store, which cannot rename: into the step directory, with
``commit_success.txt`` written last), so a partial save is never listed as a
step. ``workdir`` may be a local path or a ``gs://`` URI (:mod:`abspos_jax.storage`).
"""

import copy
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import orbax.checkpoint as ocp

from abspos_jax import config as config_lib
from abspos_jax import storage

log = logging.getLogger("abspos_jax")


def manager(workdir: str, ckpt: ml_collections.ConfigDict | None = None, *, read_only: bool = False
            ) -> ocp.CheckpointManager:
  """The run's manager; ``read_only`` for analysis (no cleanup, no new directories).

  Kept: the latest ``ckpt.keep`` checkpoints, and with ``ckpt.keep_period > 0``
  also every checkpoint whose step is a multiple of it.
  """
  policy = None
  if ckpt is not None:
    policies = [ocp.checkpoint_managers.LatestN(n=ckpt.keep)]
    if ckpt.keep_period:
      policies.append(ocp.checkpoint_managers.EveryNSteps(interval_steps=ckpt.keep_period))
    policy = ocp.checkpoint_managers.AnyPreservationPolicy(policies)
  options = ocp.CheckpointManagerOptions(
      preservation_policy=policy,
      enable_async_checkpointing=bool(ckpt is not None and ckpt.async_save),
      read_only=read_only,
      create=not read_only,
      cleanup_tmp_directories=not read_only,  # a save killed half-way leaves a tmp dir: never a step
  )
  path = storage.absolute(storage.join(workdir, "checkpoints"))
  return ocp.CheckpointManager(path, options=options, item_names=("params", "opt_state", "data", "meta"))


def save(mgr: ocp.CheckpointManager, step: int, params, opt_state, data_iter,
         config: ml_collections.ConfigDict) -> None:
  """Start saving ``step`` (asynchronous when the manager is)."""
  mgr.save(step, args=ocp.args.Composite(
      params=ocp.args.StandardSave(params),
      opt_state=ocp.args.StandardSave(opt_state),
      data=ocp.args.JsonSave(data_iter.get_state()),
      meta=ocp.args.JsonSave({"step": int(step), "config": config_lib.to_dict(config)}),
  ), force=True)


def abstract_like(tree, shardings):
  """``ShapeDtypeStruct``s of ``tree`` placed with ``shardings`` (a prefix tree)."""
  return jax.tree.map(
      lambda s, sub: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), sub),
      shardings, tree)


def restore(mgr: ocp.CheckpointManager, step: int, abstract_params, abstract_opt_state, data_iter):
  """Restore a full training state onto the shardings held by the abstract trees."""
  r = mgr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract_params),
      opt_state=ocp.args.StandardRestore(abstract_opt_state),
      data=ocp.args.JsonRestore(),
  ))
  data_iter.set_state(r.data)
  return r.params, r.opt_state, data_iter


def move_aside(workdir: str, step: int, folder: str, why: str) -> None:
  """Move checkpoint ``step`` to ``WORKDIR/FOLDER/STEP-TIME`` (process 0; nothing is deleted), logging ``why``.

  A later save of that step number then does not collide with it; the caller
  reloads its manager.
  """
  src = storage.join(workdir, "checkpoints", str(step))
  dst = storage.join(workdir, folder, f"{step}-{int(time.time())}")
  log.warning("checkpoint %s %s; moved to %s", src, why, dst)
  if jax.process_index() == 0:
    storage.move(src, dst)


def restore_latest(mgr: ocp.CheckpointManager, workdir: str, abstract_params, abstract_opt_state,
                   make_iter: Callable[[], Any], at_most: int | None = None):
  """Restore the newest checkpoint that restores; move unreadable ones to ``corrupt_checkpoints/``.

  Orbax only lists complete checkpoints (a write killed half-way stays a
  temporary directory), so what fails here is a damaged file. Nothing is
  deleted: the damaged step is moved aside with a warning (:func:`move_aside`).
  Returns ``(step, params, opt_state, data_iter)``, with ``step = 0`` and
  ``None`` s when nothing restores. ``at_most`` ignores checkpoints of later steps.
  """
  for step in sorted((s for s in mgr.all_steps() if at_most is None or s <= at_most), reverse=True):
    data_iter = make_iter()
    try:
      params, opt_state, data_iter = restore(mgr, step, abstract_params, abstract_opt_state, data_iter)
      return step, params, opt_state, data_iter
    except Exception as e:  # orbax, tensorstore and json raise many types for a damaged file
      move_aside(workdir, step, "corrupt_checkpoints",
                 f"cannot be restored ({type(e).__name__}: {str(e).splitlines()[0][:300]}), trying an older one")
      mgr.reload()
  return 0, None, None, make_iter()


class Restorable(NamedTuple):
  """What :func:`restore_group` needs of one run: its checkpoint manager, its directory, and how to make a fresh
  data iterator (the iterator restored from a checkpoint, or a new one)."""
  mgr: ocp.CheckpointManager
  workdir: str
  make_iter: Callable[[], Any]


def restore_group(runs: Sequence[Restorable], abstract_params, abstract_opt_state
                  ) -> tuple[int, list[tuple[Any, Any]] | None, list[Any]]:
  """Restore every run of a group at one step. Returns ``(step, [(params, opt_state)] or None, [data iterator])``.

  One run: :func:`restore_latest`. Runs trained together must resume at the same step.
  When their newest restorable checkpoints differ (a kill during a group save
  can complete one run's checkpoint and not another's; a damaged checkpoint is
  moved aside in one run only), all resume from the newest step that every run
  restores, and each run's newer checkpoints are moved to
  ``WORKDIR/unshared_checkpoints/STEP-TIME`` (nothing is deleted; the group
  writes those steps again). When the runs share no step (one run has no
  checkpoint, e.g. a seed was added to ``--seeds``), this refuses with a
  :class:`~abspos_jax.config.ConfigError` rather than restart the others.
  ``(0, None)`` when no run has a checkpoint.
  """
  results: list = [None] * len(runs)
  at_most = None
  while True:
    for i, run in enumerate(runs):
      if results[i] is None or results[i][0] > at_most:
        results[i] = restore_latest(run.mgr, run.workdir, abstract_params, abstract_opt_state, run.make_iter, at_most)
    steps = [r[0] for r in results]
    if min(steps) == max(steps):
      break
    if min(steps) == 0:
      held = "; ".join(f"{run.workdir}: {run.mgr.all_steps() or 'none'}" for run in runs)
      raise config_lib.ConfigError(
          f"the runs trained together share no checkpoint step to resume from ({held}). Seeds trained together "
          f"resume only from a step every run holds: train each run that lags alone up to step {max(steps)} "
          f"(train.py --workdir=DIR --config.train.seed=SEED --config.train.stop_at_step={max(steps)}, same config) "
          f"and rerun, or give the group another --workdir")
    at_most = min(steps)
  step = steps[0]
  for run in runs:
    newer = [s for s in run.mgr.all_steps() if s > step]
    for s in newer:
      move_aside(run.workdir, s, "unshared_checkpoints",
                 f"is newer than step {step}, the newest step every run trained together can resume from")
    if newer:
      run.mgr.reload()
  states = None if step == 0 else [(params, opt_state) for _, params, opt_state, _ in results]
  return step, states, [data_iter for _, _, _, data_iter in results]


def restore_params(mgr: ocp.CheckpointManager, step: int, abstract_params):
  """Only the parameters (analysis, export), onto any mesh or a single device."""
  return mgr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params))).params


def restore_meta(mgr: ocp.CheckpointManager, step: int) -> dict:
  return mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def saved_steps(workdir: str) -> list[int]:
  """The steps of the complete checkpoints in ``workdir/checkpoints``, oldest first (``[]`` when there is none).

  Read from the directory listing (no restore) by orbax's own test for a
  finished step: a digits-only directory name (a local save in progress is
  ``<step>.orbax-checkpoint-tmp-*``) that, in an object store, also holds the
  ``commit_success.txt`` marker.
  """
  path = storage.join(workdir, "checkpoints")
  if not storage.path(path).is_dir():
    return []
  return sorted(ocp.utils.checkpoint_steps(path))


def kept_steps(workdir: str) -> tuple[ml_collections.ConfigDict, list[int]]:
  """``(config, steps)``: the resolved config of a run and its complete checkpoints, oldest first.

  Raises ``FileNotFoundError`` / ``ValueError`` naming what is missing: the
  workdir, its ``config.json``, its ``checkpoints/``, or any checkpoint.
  """
  if not storage.path(workdir).is_dir():
    raise FileNotFoundError(f"--workdir {workdir} does not exist")
  config_path = storage.join(workdir, "config.json")
  if not storage.path(config_path).exists() or not storage.path(storage.join(workdir, "checkpoints")).is_dir():
    raise ValueError(f"{workdir} is not an abspos_jax run: it needs config.json and checkpoints/ (train.py writes both)")
  config = ml_collections.ConfigDict(storage.read_json(config_path))
  config.mesh.shape, config.mesh.axes = tuple(config.mesh.shape), tuple(config.mesh.axes)
  steps = saved_steps(workdir)
  if not steps:
    raise ValueError(f"{workdir}/checkpoints holds no complete checkpoint")
  return config, steps


def load_model(workdir: str, step: int | None = None, device: jax.Device | None = None):
  """The model of a run, restored onto one device (whatever mesh it was trained on), with the explicit
  attention path (``attention_impl="xla"``, the one hook points read) whatever kernel trained it.

  Returns ``(config, model, step)``. Raises ``FileNotFoundError`` / ``ValueError``
  naming what is missing: the workdir, its ``config.json``, any checkpoint, or ``step``.
  """
  from flax import nnx

  from abspos_jax import model as model_lib

  config, steps = kept_steps(workdir)
  mgr = manager(workdir, read_only=True)
  step = max(steps) if step is None else step
  if step not in steps:
    raise ValueError(f"--step {step} is not in {workdir}/checkpoints; available steps: {sorted(steps)}")
  device = device or jax.local_devices()[0]
  explicit = copy.deepcopy(config)
  explicit.model.attention_impl = "xla"
  abstract = nnx.eval_shape(lambda: model_lib.create(explicit))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)),
                        abstract_params)
  try:
    params = restore_params(mgr, step, target)
  except Exception as e:  # orbax raises several types for a shape or structure mismatch
    raise ValueError(f"checkpoint {workdir}/checkpoints/{step} cannot be restored (damaged files, or a model shape "
                     f"other than its config.json's): {str(e).splitlines()[0][:500]}") from e
  mgr.close()
  return config, nnx.merge(graphdef, params), step
