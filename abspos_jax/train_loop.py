"""The training loop behind ``train.py``.

``train(config, workdir)`` validates the config, builds the mesh, initialises
(or restores) a sharded model and optimizer, and runs the jitted train step,
logging to ``metrics.jsonl`` and TensorBoard and checkpointing with orbax.
Rerunning the same command resumes from the latest complete checkpoint.
:class:`Trainer` is that loop: setup, then one step and the periodic actions
(log, evaluate, checkpoint), each scheduled by :func:`itstime`.

``train_seeds(config, workdir_template, seeds)`` trains K seeds of one config
together through the same loop: params and optimizer state are stacked on a
leading seed axis and the step is ``jax.vmap`` of the one-run step. It writes
K ordinary run directories, each exactly what ``train`` with that
``train.seed`` writes.
"""

import copy
import dataclasses
import errno
import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from abspos_jax import attention_kernels, checkpoint, data, distributed, flops, provenance, sharding, storage
from abspos_jax import model as model_lib
from abspos_jax.analysis import emergence
from abspos_jax import config as config_lib
from abspos_jax import seeds as seeds_lib
from abspos_jax.metrics import MetricsWriter
from abspos_jax.optim import learning_rate_schedule, make_optimizer
from abspos_jax.train_step import make_eval_step, make_train_step

log = logging.getLogger("abspos_jax")


def check_workdir(config: ml_collections.ConfigDict, workdir: str, record: bool = True) -> None:
  """Refuse a workdir that holds a run with a different config; record ours otherwise (when ``record``)."""
  differing = config_lib.workdir_diff(workdir, config)
  if differing:
    lines = "\n".join(f"  {name}: stored {a!r}, now {b!r}" for name, a, b in differing)
    raise config_lib.ConfigError(
        f"{workdir} holds a run with a different config; resume only with the same config, "
        f"or choose another --workdir. Differing fields:\n{lines}")
  if record and jax.process_index() == 0:
    storage.write_json(storage.join(workdir, "config.json"), config_lib.to_dict(config))


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


def make_iter(config: ml_collections.ConfigDict):
  """A fresh iterator over a run's batches (this process's share), in the order of its ``train.seed``."""
  t = config.train
  return data.train_iterator(config.data, batch_size=t.batch_size // jax.process_count(), seed=t.seed,
                             process_index=jax.process_index(), process_count=jax.process_count())


@dataclasses.dataclass
class RunDir:
  """One run directory the loop writes: the config, checkpoints, metrics and data order of one seed.

  Built once, by :meth:`Trainer._init_state`, after the group is restored.
  """
  config: ml_collections.ConfigDict
  workdir: str
  mgr: Any
  writer: MetricsWriter
  data_iter: Any
  skipped: int = 0  # batches dropped under train.nonfinite = "skip"

  def label(self, k: int) -> str:
    return run_label(self.config, self.workdir, k)


def run_label(config: ml_collections.ConfigDict, workdir: str, k: int) -> str:
  """How messages name a run of a group of ``k`` (empty for a single run)."""
  return "" if k == 1 else f" of seed {config.train.seed} ({workdir})"


@dataclasses.dataclass
class StepInfo:
  """What a periodic action sees after a step (1-based ``step``): the step's outputs ``metrics`` (on device: loss,
  grad_norm, finite; a leading seed axis for K runs), whether the loop stops after it, and ``records``, one dict
  per run that actions add to and the log action writes."""
  step: int
  metrics: dict
  stopping: bool
  records: list[dict]


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


def itstime(step: int, every: int, total: int, force: bool = False) -> bool:
  """Whether a periodic action runs at ``step`` (1-based): every ``every`` steps, at the last step, or when forced.

  big_vision's ``utils.itstime``: each action of the loop (log, evaluate,
  checkpoint) asks it with its own period; ``force`` is a stop request.
  """
  return force or step == total or (every > 0 and step % every == 0)


def train(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Train (or resume) the run of ``config`` in ``workdir``; returns the last logged metrics."""
  return Trainer([config], [workdir]).run()[0]


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
  can restore (:func:`checkpoint.restore_group`). A run directory holding
  another config is refused as in ``train``.
  """
  configs = []
  for s in seeds:
    c = copy.deepcopy(config)
    c.train.seed = int(s)
    configs.append(c)
  return Trainer(configs, seeds_lib.seed_workdirs(workdir_template, seeds)).run()


def _attention_kernel(config: ml_collections.ConfigDict) -> str:
  """The kernel ``model.attention_impl`` runs on this machine, logged; a kernel that cannot run here is
  refused (``ValueError`` with the reason) before any work."""
  spec = model_lib.ModelSpec.from_config(config)
  kernel = attention_kernels.resolve(spec.attention_impl, dtype=spec.dtype, head_dim=spec.head_dim,
                                     seq_len=config.data.seq_len)
  log.info("attention kernel: %s (model.attention_impl=%s, backend %s)", kernel, spec.attention_impl,
           jax.default_backend())
  return kernel


def _open_workdir(config: ml_collections.ConfigDict, workdir: str, record: bool) -> None:
  try:
    storage.makedirs(workdir)
    check_workdir(config, workdir, record)
  except OSError as e:
    raise OSError(e.errno, f"--workdir {workdir} cannot be used: {e.strerror or e}") from e


class Trainer:
  """K runs whose configs differ at most in ``train.seed``, trained by one jitted step (stacked for K > 1).

  Building it validates the configs, opens the run directories (all are
  checked before any is written, so a refusal leaves every one as it was),
  creates or restores the sharded state and compiles nothing yet. :meth:`run`
  is the loop: one train step per iteration, then the periodic actions
  (``self.hooks``, each ``fn(StepInfo)`` on its own schedule, :func:`itstime`):
  the progress bar, evaluation and the emergence metrics
  (``train.eval_every``), the log (``train.log_every``, and after every
  evaluation), the checkpoint (``checkpoint.every``). :meth:`add_hook` adds
  one. A stop (``train.stop_at_step``, SIGTERM, SIGINT) logs and checkpoints
  the step it stops after.
  """

  def __init__(self, configs: list[ml_collections.ConfigDict], workdirs: list[str]):
    self.config = config = configs[0]
    if distributed.requested(config):
      distributed.initialize(config)
    for c in configs:
      config_lib.validate(c)
    self.attention_kernel = _attention_kernel(config)
    for record in (False, True):
      for c, w in zip(configs, workdirs):
        _open_workdir(c, w, record)
    self.k = len(configs)
    self.mesh = sharding.make_mesh(config)
    self.tx = make_optimizer(config.train)
    self._init_state(configs, workdirs)
    self._build_steps()
    t = config.train
    self.tokens_per_step = t.batch_size * config.data.seq_len  # per run; the group's step is K times that
    self.flops_per_token = flops.train_flops_per_token(model_lib.ModelSpec.from_config(config), config.data.seq_len)
    self.peak = flops.peak_flops_per_device(t.peak_flops)
    self.schedule = learning_rate_schedule(t)
    self.lasts: list[dict] = [{} for _ in self.runs]
    self.saved = self.start
    self._pending = None  # (step, finite flags) of the last step, checked a step late to keep dispatch async
    self._window = (time.perf_counter(), 0)  # (start time, steps) since the last log
    self.bar = None
    # The periodic actions, in order: (when(info), fn(info)); add more with add_hook.
    self.hooks: list[tuple[Callable[[StepInfo], bool], Callable[[StepInfo], None]]] = []
    self.add_hook(self._tick, every=1)
    self.add_hook(self._evaluate, every=t.eval_every)
    # Logged every train.log_every steps, at a stop, and whenever an evaluation added to the record.
    self.hooks.append((lambda i: itstime(i.step, t.log_every, t.steps, force=i.stopping or bool(i.records[0])),
                       self._log))
    self.add_hook(self._save, every=config.checkpoint.every, on_stop=True)

  def _init_state(self, configs: list[ml_collections.ConfigDict], workdirs: list[str]) -> None:
    """Fresh or restored params and optimizer state, and the run directories (checkpoint manager, metrics writer
    and data iterator of each)."""
    config = self.config
    seeds = None if self.k == 1 else [c.train.seed for c in configs]
    graphdef, params, opt_state, param_sh, opt_sh = init_state(config, self.mesh, self.tx, seeds=seeds)
    self.graphdef = graphdef
    self.axis = seeds_lib.SeedAxis(self.k, param_sh, opt_sh, sharding.batch_sharding(self.mesh, config.mesh.rules))
    slots = [checkpoint.Restorable(checkpoint.manager(w, config.checkpoint), w, functools.partial(make_iter, c))
             for c, w in zip(configs, workdirs)]
    try:
      self.start, restored, iters = checkpoint.restore_group(slots, *self.axis.abstract_run(params, opt_state))
    except BaseException:
      for slot in slots:
        slot.mgr.close()
      raise
    if self.start:
      params, opt_state = self.axis.join(restored)
      log.info("resumed from step %d of %s", self.start, ", ".join(workdirs))
    self.params, self.opt_state = params, opt_state
    self.runs = []
    for c, slot, data_iter in zip(configs, slots, iters):
      entry = (provenance.record_training(slot.workdir, self.start, run_label(c, slot.workdir, self.k),
                                          attention_kernel=self.attention_kernel)
               if jax.process_index() == 0 else None)
      writer = MetricsWriter(slot.workdir, resume_step=self.start if self.start else None, provenance=entry)
      self.runs.append(RunDir(c, slot.workdir, slot.mgr, writer, data_iter))

  def _build_steps(self) -> None:
    """The jitted train and eval steps, the held-out batch and the emergence hook."""
    config, axis, t = self.config, self.axis, self.config.train
    self.train_step = jax.jit(axis.vmap(make_train_step(self.graphdef, self.tx, t.grad_accum, t.loss_chunk)),
                              in_shardings=(axis.param_sh, axis.opt_sh, axis.batch_sh),
                              out_shardings=(axis.param_sh, axis.opt_sh, None), donate_argnums=(0, 1))
    batch_sh = sharding.batch_sharding(self.mesh, config.mesh.rules)
    self.eval_step = jax.jit(axis.vmap(make_eval_step(self.graphdef, t.loss_chunk), in_axes=(0, None)),
                             in_shardings=(axis.param_sh, batch_sh))
    dp = config_lib.data_parallel_size(dict(self.mesh.shape), config.mesh.rules)
    n_eval = max(dp, config.data.eval_sequences // dp * dp)
    eval_tokens = data.eval_sequences(config.data, num_sequences=n_eval)
    per_process = n_eval // jax.process_count()
    mine = slice(jax.process_index() * per_process, (jax.process_index() + 1) * per_process)
    self.eval_batch = jax.make_array_from_process_local_data(batch_sh, eval_tokens[mine], eval_tokens.shape)
    self.hook = (emergence.EmergenceHook(config, self.graphdef, self.params, self.mesh,
                                         num_runs=0 if self.k == 1 else self.k) if t.emergence else None)

  def add_hook(self, fn: Callable[[StepInfo], None], every: int, on_stop: bool = False) -> None:
    """Run ``fn(info)`` after every ``every``-th step and the last one (and at a stop, with ``on_stop``), after the
    actions added before it (levanter's ``add_hook``)."""
    total = self.config.train.steps
    self.hooks.append((lambda i: itstime(i.step, every, total, force=on_stop and i.stopping), fn))

  def run(self) -> list[dict]:
    """Train from the restored step to ``train.steps`` (or a stop); returns each run's last logged metrics."""
    t = self.config.train
    self.bar = self._progress()
    step = self.start
    try:
      with StopRequest() as stop:
        for step in range(self.start + 1, t.steps + 1):
          metrics = self._advance(step)
          info = StepInfo(step, metrics, step == t.stop_at_step or stop.signal_name is not None,
                          [{} for _ in self.runs])
          for when, fn in self.hooks:
            if when(info):
              fn(info)
          if info.stopping:
            why = f"on {stop.signal_name}" if stop.signal_name else "as train.stop_at_step asks"
            log.warning("stopped after step %d %s, checkpoint saved; rerun the same command to resume", step, why)
            break
    except Exception as e:
      if is_disk_full(e):
        raise self._disk_full(step) from e
      raise
    finally:
      # Also on an error or a stop: a checkpoint being written asynchronously must land, in every run.
      self._finish(failing=sys.exc_info()[0] is not None, bar=self.bar)
    return self.lasts

  def _progress(self):
    if not (self.config.train.progress and jax.process_index() == 0):
      return None
    from tqdm import tqdm
    return tqdm(total=self.config.train.steps, initial=self.start, unit="step", dynamic_ncols=True)

  def _advance(self, step: int) -> dict:
    """One train step on the next batch of every run; the previous step's finiteness is checked meanwhile."""
    shape = (self.config.train.batch_size, self.config.data.seq_len + 1)
    tokens = self.axis.batch([next(run.data_iter)["tokens"] for run in self.runs], shape)
    self.params, self.opt_state, metrics = self.train_step(self.params, self.opt_state, tokens)
    self._check_finite()
    self._pending = (step, metrics["finite"])
    self._window = (self._window[0], self._window[1] + 1)
    return metrics

  def _check_finite(self) -> None:
    """Act on the pending step's finite flags (``train.nonfinite``: skip counts, stop raises)."""
    if self._pending is None:
      return
    (step, finite), self._pending = self._pending, None
    bad = [run for run, ok in zip(self.runs, self.axis.per_run(finite)) if not ok]
    if not bad:
      return
    if self.config.train.nonfinite == "skip":
      for run in bad:
        run.skipped += 1
        log.warning("non-finite loss or gradient at step %d%s: batch skipped (%d so far)", step, run.label(self.k),
                    run.skipped)
      return
    where = ",".join(run.label(self.k) for run in bad)
    raise NonFiniteError(
        f"non-finite loss or gradient at step {step}{where}: the update was not applied and training stopped; "
        f"the last checkpoint (step {self.saved}) is untouched. Rerun to resume from it, or set "
        f"--config.train.nonfinite=skip to drop such batches")

  def _tick(self, info: StepInfo) -> None:
    if self.bar is not None:
      self.bar.update(1)

  def _evaluate(self, info: StepInfo) -> None:
    """The held-out loss and the emergence metrics, into ``info.records`` (the log action writes them). Its time
    is kept out of the throughput window."""
    self._check_finite()
    jax.block_until_ready(info.metrics)  # the step's own time stays in the window
    started = time.perf_counter()
    val = self.axis.per_run(self.eval_step(self.params, self.eval_batch))
    emerged = self.hook(self.params) if self.hook is not None else None
    for i, record in enumerate(info.records):
      record["val_loss"] = float(val[i])
      record.update(emerged[i] if emerged is not None else {})
    self._window = (self._window[0] + time.perf_counter() - started, self._window[1])

  def _log(self, info: StepInfo) -> None:
    """One record per run in metrics.jsonl and TensorBoard: the step's metrics, throughput and what the other
    actions added (``info.records``)."""
    self._check_finite()
    step, metrics = info.step, jax.device_get(info.metrics)
    per_run = self.axis.per_run
    losses, grad_norms = per_run(metrics["loss"]), per_run(metrics["grad_norm"])
    started, steps = self._window
    tps = steps * self.tokens_per_step / (time.perf_counter() - started)  # per run: the group's divided by K
    per_device = tps / jax.device_count()
    for i, run in enumerate(self.runs):
      record = {"loss": losses[i], "grad_norm": grad_norms[i], "learning_rate": self.schedule(step - 1),
                "tokens_per_s": tps, "tokens_per_s_per_device": per_device,
                "tflops_per_device": per_device * self.flops_per_token / 1e12,
                "mfu": per_device * self.flops_per_token / self.peak, "tokens": step * self.tokens_per_step,
                "skipped_steps": run.skipped, **info.records[i]}
      run.writer.write(step, record)
      self.lasts[i] = record
    if self.bar is not None:
      self.bar.set_postfix(loss=f"{np.mean(losses):.3f}", tok_s=f"{self.k * tps:,.0f}",
                           mfu=f"{self.k * self.lasts[0]['mfu']:.1%}")
    self._window = (time.perf_counter(), 0)

  def _save(self, info: StepInfo) -> None:
    self._check_finite()  # never checkpoint a state whose last update was not finite
    step = info.step
    for run, (params, opt_state) in zip(self.runs, self.axis.split(self.params, self.opt_state)):
      checkpoint.save(run.mgr, step, params, opt_state, run.data_iter, run.config)
    self.saved = step

  def _disk_full(self, step: int) -> OSError:
    for run in self.runs:
      run.mgr.reload()
    where = ", ".join(run.workdir for run in self.runs)
    intact = "; ".join(f"{run.mgr.all_steps()}" + ("" if self.k == 1 else f" in {run.workdir}") for run in self.runs)
    return OSError(errno.ENOSPC, f"no space left on the device of {where} at step {step}; the complete "
                   f"checkpoints {intact} are intact (a partial one is never listed): free space and "
                   f"rerun the same command to resume")

  def _finish(self, failing: bool, bar) -> None:
    """Let pending checkpoints land and close every writer; the first failure is raised unless one is already."""
    first = None
    for run in self.runs:
      try:
        run.mgr.wait_until_finished()
        run.mgr.close()
        run.writer.close()
      except Exception as e:  # e.g. a full disk when writing the checkpoint or flushing TensorBoard events
        if failing or first is not None:
          log.warning("finishing %s (checkpoint %d, metrics) after an error failed too: %s", run.workdir,
                      self.saved, str(e)[:300])
        else:
          first = e
    if bar is not None:
      bar.close()
    if first is not None:
      if is_disk_full(first):
        raise self._disk_full(self.saved) from first
      raise first
