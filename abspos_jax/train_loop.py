"""The training loop behind ``train.py``.

``train(config, workdir)`` validates the config, builds the mesh, initialises
(or restores) a sharded model and optimizer, and runs the jitted train step,
logging to ``metrics.jsonl`` and TensorBoard and checkpointing with orbax.
Rerunning the same command resumes from the latest complete checkpoint.

``train_seeds(config, workdir_template, seeds)`` trains K seeds of one config
together through the same loop: params and optimizer state are stacked on a
leading seed axis and the step is ``jax.vmap`` of the one-run step. It writes
K ordinary run directories, each exactly what ``train`` with that
``train.seed`` writes.
"""

import copy
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import atomic, checkpoint, data, distributed, emergence, flops, model as model_lib, sharding
from abspos_jax import config as config_lib
from abspos_jax.metrics import MetricsWriter
from abspos_jax.optim import learning_rate_schedule, make_optimizer
from abspos_jax.train_step import make_eval_step, make_train_step

log = logging.getLogger("abspos_jax")


def check_workdir(config: ml_collections.ConfigDict, workdir: str, record: bool = True) -> None:
  """Refuse a workdir that holds a run with a different config; record ours otherwise (when ``record``)."""
  path = os.path.join(workdir, "config.json")
  current = config_lib.to_dict(config)
  if os.path.exists(path):
    with open(path) as f:
      stored = json.load(f)
    differing = config_lib.diff(stored, current)
    if differing:
      lines = "\n".join(f"  {name}: stored {a!r}, now {b!r}" for name, a, b in differing)
      raise config_lib.ConfigError(
          f"{workdir} holds a run with a different config; resume only with the same config, "
          f"or choose another --workdir. Differing fields:\n{lines}")
  if record and jax.process_index() == 0:
    atomic.write_json(path, current)


def init_state(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, tx, seeds: Sequence[int] | None = None):
  """Sharded params and optimizer state, created directly on their devices.

  With ``seeds`` (K of them) every array gets a leading seed axis of size K,
  copy ``k`` initialised as ``model.create(config, seed=seeds[k])``; that axis
  is replicated (:func:`sharding.stacked`). Returns ``(graphdef, params,
  opt_state, param_shardings, opt_shardings)``, the shardings those of ONE
  run's trees (without the seed axis).
  """
  rules = config.mesh.rules
  abstract = nnx.eval_shape(lambda: model_lib.create(config))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  param_sh = sharding.tree_shardings(abstract_params, mesh, rules)
  opt_sh = sharding.tree_shardings(jax.eval_shape(tx.init, abstract_params), mesh, rules)
  # The seed is an argument, not a constant: one compiled init serves every seed.
  init = lambda s: nnx.split(model_lib.create(config, seed=jax.random.key(s)), nnx.Param)[1]
  if seeds is None:
    params = jax.jit(init, out_shardings=param_sh)(np.uint32(config.train.seed))
    opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
  else:  # one traced init batched over the seeds: the same draws as K separate inits
    params = jax.jit(jax.vmap(init), out_shardings=sharding.stacked(param_sh))(np.asarray(seeds, np.uint32))
    opt_state = jax.jit(jax.vmap(tx.init), out_shardings=sharding.stacked(opt_sh))(params)
  return graphdef, params, opt_state, param_sh, opt_sh


def _stack(trees):
  """One tree whose leaves are ``[K, ...]``: leaf ``k`` of ``trees[k]`` at index ``k``."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


class SeedAxis:
  """How the loop holds the states of its K runs: as they are for K = 1, stacked for K > 1.

  For K > 1 every array of params and optimizer state has a leading axis of
  size K (run ``k`` at index ``k``), replicated over the mesh; a batch is
  ``tokens [K, B, T + 1]`` with ``B`` split over the mesh as for one run; the
  train and eval steps are ``jax.vmap`` of the one-run steps, so each copy
  computes exactly what one run computes. For K = 1 nothing is stacked and the
  one-run steps run as they are.
  """

  def __init__(self, k: int, param_sh, opt_sh, batch_sh):
    self.k = k
    self.run_shardings = (param_sh, opt_sh)
    lead = sharding.stacked if k > 1 else (lambda sh: sh)
    self.param_sh, self.opt_sh, self.batch_sh = lead(param_sh), lead(opt_sh), lead(batch_sh)
    self._split = jax.jit(lambda state: [jax.tree.map(lambda x: x[i], state) for i in range(k)],
                          out_shardings=[self.run_shardings] * k)
    self._join = jax.jit(_stack, out_shardings=(self.param_sh, self.opt_sh))

  def vmap(self, fn, in_axes=0):
    """``fn`` for K = 1, ``jax.vmap(fn, in_axes)`` over the seed axis for K > 1."""
    return fn if self.k == 1 else jax.vmap(fn, in_axes=in_axes)

  def split(self, params, opt_state) -> list[tuple[Any, Any]]:
    """``[(params, opt_state)]`` of each run, placed as one run's state is."""
    return [(params, opt_state)] if self.k == 1 else self._split((params, opt_state))

  def join(self, states: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """Inverse of :meth:`split`."""
    return states[0] if self.k == 1 else self._join(states)

  def abstract_run(self, params, opt_state) -> tuple[Any, Any]:
    """Shapes, dtypes and shardings of ONE run's params and optimizer state (what a checkpoint holds)."""
    one = (lambda tree: tree) if self.k == 1 else (
        lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), tree))
    return (checkpoint.abstract_like(one(params), self.run_shardings[0]),
            checkpoint.abstract_like(one(opt_state), self.run_shardings[1]))

  def batch(self, local: list[np.ndarray], shape: tuple[int, ...]) -> jax.Array:
    """The global batch (``shape`` for one run) from each run's process-local rows."""
    if self.k == 1:
      return jax.make_array_from_process_local_data(self.batch_sh, local[0], shape)
    return jax.make_array_from_process_local_data(self.batch_sh, np.stack(local), (self.k, *shape))

  def per_run(self, x) -> np.ndarray:
    """``[K]`` host values of a per-run scalar (a plain scalar for K = 1)."""
    return np.reshape(np.asarray(x), (self.k,))


@dataclasses.dataclass
class Run:
  """One run directory the loop writes: the config, checkpoints, metrics and data order of one seed."""
  config: ml_collections.ConfigDict
  workdir: str
  mgr: Any = None
  writer: MetricsWriter | None = None
  data_iter: Any = None
  skipped: int = 0  # batches dropped under train.nonfinite = "skip"

  def make_iter(self):
    """A fresh iterator over this run's batches, in the order of its ``train.seed``."""
    t = self.config.train
    return data.train_iterator(
        self.config.data, batch_size=t.batch_size // jax.process_count(), seed=t.seed,
        process_index=jax.process_index(), process_count=jax.process_count())

  def label(self, k: int) -> str:
    """How messages name this run when K > 1 (empty for a single run)."""
    return "" if k == 1 else f" of seed {self.config.train.seed} ({self.workdir})"


class NonFiniteError(FloatingPointError):
  """A NaN or Inf loss or gradient under ``train.nonfinite = "stop"``."""


class StopRequest:
  """Turns SIGTERM / SIGINT into a request to checkpoint and exit after the current step."""

  def __init__(self):
    self.signal_name: str | None = None
    self._previous = {}

  def __enter__(self) -> "StopRequest":
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame) -> None:
    if self.signal_name is not None:  # a second Ctrl-C: stop now
      raise KeyboardInterrupt
    self.signal_name = signal.Signals(signum).name

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def is_disk_full(e: BaseException) -> bool:
  """ENOSPC, as Python raises it or as tensorstore (orbax's writer) reports it."""
  return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e)


def restore_latest(mgr, workdir: str, abstract_params, abstract_opt_state, make_iter, at_most: int | None = None):
  """Restore the newest checkpoint that restores; move unreadable ones to ``corrupt_checkpoints/``.

  Orbax only lists complete checkpoints (a write killed half-way stays a
  temporary directory), so what fails here is a damaged file. Nothing is
  deleted: the damaged step is moved aside with a warning, so a later save of
  that step number does not collide with it. Returns ``(step, params,
  opt_state, data_iter)``, with ``step = 0`` and ``None`` s when nothing restores.
  ``at_most`` ignores checkpoints of later steps.
  """
  for step in sorted((s for s in mgr.all_steps() if at_most is None or s <= at_most), reverse=True):
    data_iter = make_iter()
    try:
      params, opt_state, data_iter = checkpoint.restore(mgr, step, abstract_params, abstract_opt_state, data_iter)
      return step, params, opt_state, data_iter
    except Exception as e:  # orbax, tensorstore and json raise many types for a damaged file
      src = os.path.join(workdir, "checkpoints", str(step))
      dst = os.path.join(workdir, "corrupt_checkpoints", f"{step}-{int(time.time())}")
      log.warning("checkpoint %s cannot be restored (%s: %s); moved to %s, trying an older one",
                  src, type(e).__name__, str(e).splitlines()[0][:300], dst)
      if jax.process_index() == 0:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.move(src, dst)
      mgr.reload()
  return 0, None, None, make_iter()


def restore_runs(runs: list[Run], abstract_params, abstract_opt_state) -> tuple[int, list[tuple[Any, Any]] | None]:
  """Restore every run at one step; sets each ``run.data_iter``. Returns ``(step, [(params, opt_state)])``.

  One run: :func:`restore_latest`. Runs trained together must resume at the
  same step. When their newest restorable checkpoints differ (a kill during a
  group save can complete one run's checkpoint and not another's; a damaged
  checkpoint is moved aside in one run only), all resume from the newest step
  that every run restores, and each run's newer checkpoints are moved to
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
  for run, (_, _, _, data_iter) in zip(runs, results):
    run.data_iter = data_iter
    newer = [s for s in run.mgr.all_steps() if s > step]
    for s in newer:
      src = os.path.join(run.workdir, "checkpoints", str(s))
      dst = os.path.join(run.workdir, "unshared_checkpoints", f"{s}-{int(time.time())}")
      log.warning("checkpoint %s is newer than step %d, the newest step every run trained together can resume "
                  "from; moved to %s", src, step, dst)
      if jax.process_index() == 0:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.move(src, dst)
    if newer:
      run.mgr.reload()
  return step, (None if step == 0 else [(params, opt_state) for _, params, opt_state, _ in results])


def _progress(config, start: int):
  if not (config.train.progress and jax.process_index() == 0):
    return None
  from tqdm import tqdm
  return tqdm(total=config.train.steps, initial=start, unit="step", dynamic_ncols=True)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (or resume) the run of ``config`` in ``workdir``; returns the last logged metrics."""
  return _train_runs([config], [workdir])[0]


SEED_FIELD = "{seed}"


def seed_workdirs(workdir_template: str, seeds: Sequence[int]) -> list[str]:
  """``workdir_template`` with its literal ``{seed}`` replaced by each seed; refuses bad templates and seed lists."""
  if SEED_FIELD not in workdir_template:
    raise config_lib.ConfigError(
        f"--workdir must contain the literal {SEED_FIELD} when --seeds is given (one run directory per seed, "
        f"e.g. runs/rope-s{SEED_FIELD}), got {workdir_template!r}")
  if not seeds:
    raise config_lib.ConfigError("--seeds must list at least one seed, e.g. --seeds=0,1,2")
  repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
  if repeated:
    raise config_lib.ConfigError(f"--seeds must list distinct seeds; {repeated} appear more than once in {list(seeds)}")
  bad = [s for s in seeds if not 0 <= s < 2**32]
  if bad:
    raise config_lib.ConfigError(f"--seeds must be integers in [0, 2**32), got {bad}")
  return [workdir_template.replace(SEED_FIELD, str(s)) for s in seeds]


def train_seeds(config: ml_collections.ConfigDict, workdir_template: str, seeds: Sequence[int]) -> list[dict]:
  """Train (or resume) K seeds of ``config`` together; returns each run's last logged metrics.

  Run ``k`` is ``config`` with ``train.seed = seeds[k]`` (whatever
  ``config.train.seed`` says) in ``workdir_template.replace("{seed}",
  str(seeds[k]))``: its own initialisation, its own data order, and a run
  directory identical in layout to what ``train`` with that seed writes
  (config.json, metrics.jsonl, TensorBoard events, checkpoints of its own
  params, optimizer state and data iterator). One jitted step updates all K:
  ``jax.vmap`` of the one-run step over stacked copies (a leading seed axis of
  size K, replicated over the mesh; batches ``[K, B, T + 1]``). Each run's
  losses equal a separate run's up to float reassociation (relative ~1e-6).

  Logged per run: its own loss, grad_norm, val_loss and skipped_steps;
  ``tokens_per_s``, ``tflops_per_device`` and ``mfu`` are the group's divided
  by K (each run's share: the group's throughput is K times what a run logs).
  ``train.nonfinite``: a non-finite seed's update is dropped without touching
  the others; ``stop`` stops the group naming the seed and step, ``skip``
  counts per run. Rerunning resumes every run from the newest step all of them
  can restore (:func:`restore_runs`). A run directory holding another config is
  refused as in ``train``.
  """
  workdirs = seed_workdirs(workdir_template, seeds)
  configs = []
  for s in seeds:
    c = copy.deepcopy(config)
    c.train.seed = int(s)
    configs.append(c)
  return _train_runs(configs, workdirs)


def _open_workdir(config: ml_collections.ConfigDict, workdir: str, record: bool) -> None:
  try:
    os.makedirs(workdir, exist_ok=True)
    check_workdir(config, workdir, record)
  except OSError as e:
    raise OSError(e.errno, f"--workdir {workdir} cannot be used: {e.strerror or e}") from e


def _train_runs(configs: list[ml_collections.ConfigDict], workdirs: list[str]) -> list[dict]:
  """The loop: K runs whose configs differ at most in ``train.seed``, one (K = 1) or stacked (K > 1) state."""
  config = configs[0]
  if distributed.requested(config):
    distributed.initialize(config)
  for c in configs:
    config_lib.validate(c)
  runs = [Run(c, w) for c, w in zip(configs, workdirs)]
  for record in (False, True):  # all checked before any is written: a refusal leaves every directory as it was
    for run in runs:
      _open_workdir(run.config, run.workdir, record)
  k = len(runs)

  mesh = sharding.make_mesh(config)
  rules = config.mesh.rules
  spec = model_lib.ModelSpec.from_config(config)
  tx = make_optimizer(config.train)
  graphdef, params, opt_state, param_sh, opt_sh = init_state(
      config, mesh, tx, seeds=None if k == 1 else [c.train.seed for c in configs])
  batch_sh = sharding.batch_sharding(mesh, rules)
  axis = SeedAxis(k, param_sh, opt_sh, batch_sh)

  t = config.train
  seq_len = config.data.seq_len
  for run in runs:
    run.mgr = checkpoint.manager(run.workdir, config.checkpoint)
  try:
    start, restored = restore_runs(runs, *axis.abstract_run(params, opt_state))
  except BaseException:
    for run in runs:
      run.mgr.close()
    raise
  if start:
    params, opt_state = axis.join(restored)
    log.info("resumed from step %d of %s", start, ", ".join(run.workdir for run in runs))
  for run in runs:
    run.writer = MetricsWriter(run.workdir, resume_step=start if start else None)

  train_step = jax.jit(axis.vmap(make_train_step(graphdef, tx, t.grad_accum)),
                       in_shardings=(axis.param_sh, axis.opt_sh, axis.batch_sh),
                       out_shardings=(axis.param_sh, axis.opt_sh, None), donate_argnums=(0, 1))
  eval_step = jax.jit(axis.vmap(make_eval_step(graphdef), in_axes=(0, None)), in_shardings=(axis.param_sh, batch_sh))
  dp = sharding.data_parallel_size(mesh, rules)
  n_eval = max(dp, config.data.eval_sequences // dp * dp)
  eval_tokens = data.eval_sequences(config.data, num_sequences=n_eval)
  per_process = n_eval // jax.process_count()
  eval_batch = jax.make_array_from_process_local_data(
      batch_sh, eval_tokens[jax.process_index() * per_process:(jax.process_index() + 1) * per_process],
      eval_tokens.shape)
  emergence_hook = (emergence.EmergenceHook(config, graphdef, params, mesh, num_runs=0 if k == 1 else k)
                    if t.emergence else None)

  flops_per_token = flops.train_flops_per_token(spec, seq_len)
  peak = flops.peak_flops_per_device(t.peak_flops)
  schedule = learning_rate_schedule(t)
  tokens_per_step = t.batch_size * seq_len  # per run; the group's step is K times that
  bar = _progress(config, start)
  lasts: list[dict] = [{} for _ in runs]
  saved = start

  def check_finite(step_: int, finite) -> None:
    bad = [run for run, ok in zip(runs, axis.per_run(finite)) if not ok]
    if not bad:
      return
    if t.nonfinite == "skip":
      for run in bad:
        run.skipped += 1
        log.warning("non-finite loss or gradient at step %d%s: batch skipped (%d so far)", step_, run.label(k),
                    run.skipped)
      return
    where = ",".join(run.label(k) for run in bad)
    raise NonFiniteError(
        f"non-finite loss or gradient at step {step_}{where}: the update was not applied and training stopped; "
        f"the last checkpoint (step {saved}) is untouched. Rerun to resume from it, or set "
        f"--config.train.nonfinite=skip to drop such batches")

  def save(step_: int) -> None:
    nonlocal saved
    for run, (run_params, run_opt_state) in zip(runs, axis.split(params, opt_state)):
      checkpoint.save(run.mgr, step_, run_params, run_opt_state, run.data_iter, run.config)
    saved = step_

  def disk_full(e: BaseException, step_: int) -> OSError:
    for run in runs:
      run.mgr.reload()
    where = ", ".join(run.workdir for run in runs)
    intact = "; ".join(f"{run.mgr.all_steps()}" + ("" if k == 1 else f" in {run.workdir}") for run in runs)
    return OSError(errno.ENOSPC, f"no space left on the device of {where} at step {step_}; the complete "
                   f"checkpoints {intact} are intact (a partial one is never listed): free space and "
                   f"rerun the same command to resume")

  pending = None  # (step, finite flags) of the previous step, checked one step late to keep dispatch async
  window_start, window_steps = time.perf_counter(), 0
  step = start
  try:
    with StopRequest() as stop:
      for step in range(start + 1, t.steps + 1):
        tokens = axis.batch([next(run.data_iter)["tokens"] for run in runs], (t.batch_size, seq_len + 1))
        params, opt_state, metrics = train_step(params, opt_state, tokens)
        if pending is not None:
          check_finite(*pending)
        pending = (step, metrics["finite"])
        window_steps += 1
        if bar is not None:
          bar.update(1)
        stopping = step == t.stop_at_step or stop.signal_name is not None
        if step % t.log_every == 0 or step == t.steps or stopping:
          check_finite(*pending)
          pending = None
          metrics = jax.device_get(metrics)
          losses, grad_norms = axis.per_run(metrics["loss"]), axis.per_run(metrics["grad_norm"])
          elapsed = time.perf_counter() - window_start
          tps = window_steps * tokens_per_step / elapsed  # per run: the group's tokens/s divided by K
          val = None
          if step % t.eval_every == 0 or step == t.steps:
            val = axis.per_run(eval_step(params, eval_batch))
            emerged = emergence_hook(params) if emergence_hook is not None else None
          for i, run in enumerate(runs):
            lasts[i] = {"loss": losses[i], "grad_norm": grad_norms[i], "learning_rate": schedule(step - 1),
                        "tokens_per_s": tps, "tokens_per_s_per_device": tps / jax.device_count(),
                        "tflops_per_device": tps * flops_per_token / jax.device_count() / 1e12,
                        "mfu": tps * flops_per_token / jax.device_count() / peak, "tokens": step * tokens_per_step,
                        "skipped_steps": run.skipped}
            if val is not None:
              lasts[i]["val_loss"] = float(val[i])
              if emerged is not None:
                lasts[i].update(emerged[i])
            run.writer.write(step, lasts[i])
          if bar is not None:
            bar.set_postfix(loss=f"{np.mean(losses):.3f}", tok_s=f"{k * tps:,.0f}", mfu=f"{k * lasts[0]['mfu']:.1%}")
          window_start, window_steps = time.perf_counter(), 0
        if step % config.checkpoint.every == 0 or step == t.steps or stopping:
          if pending is not None:
            check_finite(*pending)
            pending = None
          save(step)
        if stopping:
          why = f"on {stop.signal_name}" if stop.signal_name else "as train.stop_at_step asks"
          log.warning("stopped after step %d %s, checkpoint saved; rerun the same command to resume", step, why)
          break
  except Exception as e:
    if is_disk_full(e):
      raise disk_full(e, step) from e
    raise
  finally:
    # Also on an error or a stop: a checkpoint being written asynchronously must land, in every run.
    failing = sys.exc_info()[0] is not None
    first = None
    for run in runs:
      try:
        run.mgr.wait_until_finished()
        run.mgr.close()
        run.writer.close()
      except Exception as e:  # e.g. a full disk when writing the checkpoint or flushing TensorBoard events
        if failing or first is not None:
          log.warning("finishing %s (checkpoint %d, metrics) after an error failed too: %s", run.workdir, saved,
                      str(e)[:300])
        else:
          first = e
    if bar is not None:
      bar.close()
    if first is not None:
      if is_disk_full(first):
        raise disk_full(first, saved) from first
      raise first
  return lasts
