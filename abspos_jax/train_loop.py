"""The training loop behind ``train.py``.

``train(config, workdir)`` validates the config, builds the mesh, initialises
(or restores) a sharded model and optimizer, and runs the jitted train step,
logging to ``metrics.jsonl`` and TensorBoard and checkpointing with orbax.
Rerunning the same command resumes from the latest complete checkpoint.
"""

import errno
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time

import jax
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import atomic, checkpoint, data, distributed, emergence, flops, model as model_lib, sharding
from abspos_jax import config as config_lib
from abspos_jax.metrics import MetricsWriter
from abspos_jax.optim import learning_rate_schedule, make_optimizer
from abspos_jax.train_step import make_eval_step, make_train_step

log = logging.getLogger("abspos_jax")


def check_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuse a workdir that holds a run with a different config; record ours otherwise."""
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
  if jax.process_index() == 0:
    atomic.write_json(path, current)


def init_state(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh, tx):
  """Sharded params and optimizer state, created directly on their devices.

  Returns ``(graphdef, params, opt_state, param_shardings, opt_shardings)``.
  """
  rules = config.mesh.rules
  abstract = nnx.eval_shape(lambda: model_lib.create(config))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)
  param_sh = sharding.tree_shardings(abstract_params, mesh, rules)
  params = jax.jit(lambda: nnx.split(model_lib.create(config), nnx.Param)[1], out_shardings=param_sh)()
  opt_sh = sharding.tree_shardings(jax.eval_shape(tx.init, abstract_params), mesh, rules)
  opt_state = jax.jit(tx.init, out_shardings=opt_sh)(params)
  return graphdef, params, opt_state, param_sh, opt_sh


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


def restore_latest(mgr, workdir: str, abstract_params, abstract_opt_state, make_iter):
  """Restore the newest checkpoint that restores; move unreadable ones to ``corrupt_checkpoints/``.

  Orbax only lists complete checkpoints (a write killed half-way stays a
  temporary directory), so what fails here is a damaged file. Nothing is
  deleted: the damaged step is moved aside with a warning, so a later save of
  that step number does not collide with it. Returns ``(step, params,
  opt_state, data_iter)``, with ``step = 0`` and ``None`` s when nothing restores.
  """
  for step in sorted(mgr.all_steps(), reverse=True):
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


def _progress(config, start: int):
  if not (config.train.progress and jax.process_index() == 0):
    return None
  from tqdm import tqdm
  return tqdm(total=config.train.steps, initial=start, unit="step", dynamic_ncols=True)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (or resume) the run of ``config`` in ``workdir``; returns the last logged metrics."""
  if distributed.requested(config):
    distributed.initialize(config)
  config_lib.validate(config)
  try:
    os.makedirs(workdir, exist_ok=True)
    check_workdir(config, workdir)
  except OSError as e:
    raise OSError(e.errno, f"--workdir {workdir} cannot be used: {e.strerror or e}") from e

  mesh = sharding.make_mesh(config)
  rules = config.mesh.rules
  spec = model_lib.ModelSpec.from_config(config)
  tx = make_optimizer(config.train)
  graphdef, params, opt_state, param_sh, opt_sh = init_state(config, mesh, tx)
  batch_sh = sharding.batch_sharding(mesh, rules)

  t = config.train
  seq_len = config.data.seq_len
  def make_iter():
    return data.train_iterator(
        config.data, batch_size=t.batch_size // jax.process_count(), seed=t.seed,
        process_index=jax.process_index(), process_count=jax.process_count())

  mgr = checkpoint.manager(workdir, config.checkpoint)
  start, r_params, r_opt, data_iter = restore_latest(
      mgr, workdir, checkpoint.abstract_like(params, param_sh), checkpoint.abstract_like(opt_state, opt_sh), make_iter)
  if start:
    params, opt_state = r_params, r_opt
    log.info("resumed from step %d of %s", start, workdir)
  writer = MetricsWriter(workdir, resume_step=start if start else None)

  train_step = jax.jit(make_train_step(graphdef, tx, t.grad_accum),
                       in_shardings=(param_sh, opt_sh, batch_sh), out_shardings=(param_sh, opt_sh, None),
                       donate_argnums=(0, 1))
  eval_step = jax.jit(make_eval_step(graphdef), in_shardings=(param_sh, batch_sh))
  dp = sharding.data_parallel_size(mesh, rules)
  n_eval = max(dp, config.data.eval_sequences // dp * dp)
  eval_tokens = data.eval_sequences(config.data, num_sequences=n_eval)
  per_process = n_eval // jax.process_count()
  eval_batch = jax.make_array_from_process_local_data(
      batch_sh, eval_tokens[jax.process_index() * per_process:(jax.process_index() + 1) * per_process],
      eval_tokens.shape)
  emergence_hook = emergence.EmergenceHook(config, graphdef, params, mesh) if t.emergence else None

  flops_per_token = flops.train_flops_per_token(spec, seq_len)
  peak = flops.peak_flops_per_device(t.peak_flops)
  schedule = learning_rate_schedule(t)
  tokens_per_step = t.batch_size * seq_len
  bar = _progress(config, start)
  last: dict = {}
  skipped = 0
  saved = start

  def check_finite(step_: int, finite) -> None:
    nonlocal skipped
    if bool(finite):
      return
    if t.nonfinite == "skip":
      skipped += 1
      log.warning("non-finite loss or gradient at step %d: batch skipped (%d so far)", step_, skipped)
      return
    raise NonFiniteError(
        f"non-finite loss or gradient at step {step_}: the update was not applied and training stopped; "
        f"the last checkpoint (step {saved}) is untouched. Rerun to resume from it, or set "
        f"--config.train.nonfinite=skip to drop such batches")

  def save(step_: int) -> None:
    nonlocal saved
    checkpoint.save(mgr, step_, params, opt_state, data_iter, config)
    saved = step_

  def disk_full(e: BaseException, step_: int) -> OSError:
    mgr.reload()
    return OSError(errno.ENOSPC, f"no space left on the device of {workdir} at step {step_}; the complete "
                   f"checkpoints {mgr.all_steps()} are intact (a partial one is never listed): free space and "
                   f"rerun the same command to resume")

  pending = None  # (step, finite flag) of the previous step, checked one step late to keep dispatch async
  window_start, window_steps = time.perf_counter(), 0
  step = start
  try:
    with StopRequest() as stop:
      for step in range(start + 1, t.steps + 1):
        local = next(data_iter)["tokens"]
        tokens = jax.make_array_from_process_local_data(batch_sh, local, (t.batch_size, seq_len + 1))
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
          elapsed = time.perf_counter() - window_start
          tps = window_steps * tokens_per_step / elapsed
          last = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "learning_rate": schedule(step - 1),
                  "tokens_per_s": tps, "tokens_per_s_per_device": tps / jax.device_count(),
                  "tflops_per_device": tps * flops_per_token / jax.device_count() / 1e12,
                  "mfu": tps * flops_per_token / jax.device_count() / peak, "tokens": step * tokens_per_step,
                  "skipped_steps": skipped}
          if step % t.eval_every == 0 or step == t.steps:
            last["val_loss"] = float(eval_step(params, eval_batch))
            if emergence_hook is not None:
              last.update(emergence_hook(params))
          writer.write(step, last)
          if bar is not None:
            bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{tps:,.0f}", mfu=f"{last['mfu']:.1%}")
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
    # Also on an error or a stop: a checkpoint being written asynchronously must land.
    failing = sys.exc_info()[0] is not None
    try:
      mgr.wait_until_finished()
    except Exception as e:
      if failing:
        log.warning("finishing checkpoint %d failed: %s", saved, str(e)[:300])
      elif is_disk_full(e):
        raise disk_full(e, saved) from e
      else:
        raise
    try:
      mgr.close()
      writer.close()
    except Exception as e:  # e.g. a full disk when flushing TensorBoard events
      if not failing:
        raise disk_full(e, saved) if is_disk_full(e) else e
      log.warning("closing the run after an error failed too: %s", str(e)[:300])
    if bar is not None:
      bar.close()
  return last
