"""The training loop behind ``train.py``.

``train(config, workdir)`` validates the config, builds the mesh, initialises
(or restores) a sharded model and optimizer, and runs the jitted train step,
logging to ``metrics.jsonl`` and TensorBoard and checkpointing with orbax.
Rerunning the same command resumes from the latest complete checkpoint.
"""

import json
import logging
import os
import time

import jax
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import checkpoint, data, flops, model as model_lib, sharding
from abspos_jax import config as config_lib
from abspos_jax.metrics import MetricsWriter
from abspos_jax.optim import learning_rate_schedule, make_optimizer
from abspos_jax.train_step import make_eval_step, make_train_step

log = logging.getLogger("abspos_jax")


def write_json_atomic(path: str, obj) -> None:
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2, sort_keys=True)
  os.replace(tmp, path)


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
    write_json_atomic(path, current)


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


def _progress(config, start: int):
  if not (config.train.progress and jax.process_index() == 0):
    return None
  from tqdm import tqdm
  return tqdm(total=config.train.steps, initial=start, unit="step", dynamic_ncols=True)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (or resume) the run of ``config`` in ``workdir``; returns the last logged metrics."""
  if config.distributed.enabled:
    jax.distributed.initialize()
  config_lib.validate(config)
  os.makedirs(workdir, exist_ok=True)
  check_workdir(config, workdir)

  mesh = sharding.make_mesh(config)
  rules = config.mesh.rules
  spec = model_lib.ModelSpec.from_config(config)
  tx = make_optimizer(config.train)
  graphdef, params, opt_state, param_sh, opt_sh = init_state(config, mesh, tx)
  batch_sh = sharding.batch_sharding(mesh, rules)

  t = config.train
  seq_len = config.data.seq_len
  data_iter = data.train_iterator(
      config.data, batch_size=t.batch_size // jax.process_count(), seed=t.seed,
      process_index=jax.process_index(), process_count=jax.process_count())
  mgr = checkpoint.manager(workdir, config.checkpoint)
  start = mgr.latest_step() or 0
  if start:
    params, opt_state, data_iter = checkpoint.restore(
        mgr, start, checkpoint.abstract_like(params, param_sh), checkpoint.abstract_like(opt_state, opt_sh),
        data_iter)
    log.info("resumed from step %d of %s", start, workdir)
  writer = MetricsWriter(workdir, resume_step=start if start else None)

  train_step = jax.jit(make_train_step(graphdef, tx, t.grad_accum),
                       in_shardings=(param_sh, opt_sh, batch_sh), out_shardings=(param_sh, opt_sh, None),
                       donate_argnums=(0, 1))
  eval_step = jax.jit(make_eval_step(graphdef), in_shardings=(param_sh, batch_sh))
  dp = sharding.data_parallel_size(mesh, rules)
  n_eval = max(dp, config.data.eval_sequences // dp * dp)
  eval_tokens = data.eval_sequences(config.data, num_sequences=n_eval)
  eval_batch = jax.make_array_from_process_local_data(
      batch_sh, eval_tokens[jax.process_index()::jax.process_count()], eval_tokens.shape)

  flops_per_token = flops.train_flops_per_token(spec, seq_len)
  peak = flops.peak_flops_per_device(t.peak_flops)
  schedule = learning_rate_schedule(t)
  tokens_per_step = t.batch_size * seq_len
  bar = _progress(config, start)
  last: dict = {}
  window_start, window_steps = time.perf_counter(), 0
  for step in range(start + 1, t.steps + 1):
    local = next(data_iter)["tokens"]
    tokens = jax.make_array_from_process_local_data(batch_sh, local, (t.batch_size, seq_len + 1))
    params, opt_state, metrics = train_step(params, opt_state, tokens)
    window_steps += 1
    if bar is not None:
      bar.update(1)
    if step % t.log_every == 0 or step == t.steps:
      metrics = jax.device_get(metrics)
      elapsed = time.perf_counter() - window_start
      tps = window_steps * tokens_per_step / elapsed
      last = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "learning_rate": schedule(step - 1),
              "tokens_per_s": tps, "tokens_per_s_per_device": tps / jax.device_count(),
              "tflops_per_device": tps * flops_per_token / jax.device_count() / 1e12,
              "mfu": tps * flops_per_token / jax.device_count() / peak, "tokens": step * tokens_per_step}
      if not np.isfinite(last["loss"]):
        raise FloatingPointError(f"non-finite loss {last['loss']} at step {step}; last checkpoint kept")
      if step % t.eval_every == 0 or step == t.steps:
        last["val_loss"] = float(eval_step(params, eval_batch))
      writer.write(step, last)
      if bar is not None:
        bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{tps:,.0f}", mfu=f"{last['mfu']:.1%}")
      window_start, window_steps = time.perf_counter(), 0
    stopping = step == t.stop_at_step
    if step % config.checkpoint.every == 0 or step == t.steps or stopping:
      checkpoint.save(mgr, step, params, opt_state, data_iter, config)
    if stopping:
      log.info("stopped after step %d as train.stop_at_step asks; rerun the same command to resume", step)
      break
  mgr.wait_until_finished()
  mgr.close()
  writer.close()
  if bar is not None:
    bar.close()
  return last
