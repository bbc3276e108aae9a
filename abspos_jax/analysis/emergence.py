"""Emergence metrics during training: sinks, position 0 and leakage at every evaluation.

With ``train.emergence`` (the default), :class:`EmergenceHook` runs at every
``train.eval_every`` step on a fixed batch of ``train.emergence_sequences``
validation sequences (``data.eval_sequences`` under the run's ``data.bos``,
the sequences ``analyze.py`` would take first). It is the analysis pass's core
step (``steps.make_core_step``: one forward through the hook points,
the denominator, leakage and position-0 accumulators) followed by
``run.finalize_core`` over all blocks (``keep=None``; ``AnalysisOptions.num_blocks``
sequence blocks, as ``analyze.py``), the code ``analyze.py`` runs, traced into one jitted
function of the parameters, compiled once per run. It reads no training
randomness and never touches the training data iterator, so the training
losses are the same with it on or off.

Logged keys (definitions and formulas: ``docs/emergence.md``,
``docs/estimators.md``), per layer ``l`` of ``L``:

* ``sink_rate_l{l}`` (``l < L``): fraction of heads whose mean weight on key 0
  over the queries ``i >= 4`` that see key 0 exceeds 0.3 on the even sequence
  blocks (summary.json ``sink_rate``);
* ``sink_score_max``: the score on the odd blocks (held out) of the head with
  the largest even-block score;
* ``pos0_norm_ratio_l{l}`` (``l <= L``, 0 = embedding output):
  ``mean ||h_0^l|| / mean_{i >= 1} ||h_i^l||``;
* ``leakage_log_weights``: held-out leakage of the log-weights, mean over heads;
* ``causal_mask_share``, ``residual_stream_share`` (and ``*_early``, queries
  ``1 <= i < 16``): the pooled v2 split of the query-position effect (against
  the mask-only normaliser, cross-fitted between the even and odd blocks);
* ``emergence_seconds``: wall time of this evaluation;
* ``emergence_fraction``: the hook's time so far (its compilation included)
  over the wall time since it was built (in this process).

Parameters stay as training shards them: the jitted function takes them as
an argument, and its other inputs are replicated over the training mesh.
"""

import logging
import time

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from abspos_jax import data
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.outputs import schema
from abspos_jax.analysis.passes.steps import init_core, make_core_step
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.core import finalize_core, fingerprint_groups, layer_visible
from abspos_jax.config import ConfigError
from abspos_jax.model import ModelSpec

log = logging.getLogger("abspos_jax")


# Per-layer hook metrics: logged as NAME_l{l} for l < num_layers + this.
_PER_LAYER = {"sink_rate": 0, "pos0_norm_ratio": 1}


def metric_names(num_layers: int) -> list[str]:
  """The statistics' keys in a metrics record (``emergence_seconds`` and ``emergence_fraction`` aside)."""
  return [key for name in schema.HOOK_METRICS for key in (
      [f"{name}_l{l}" for l in range(num_layers + _PER_LAYER[name])] if name in _PER_LAYER else [name])]


def metrics_from_core(fin: dict[str, dict[str, jax.Array]]) -> dict[str, jax.Array]:
  """The logged statistics from ``run.finalize_core``'s results (scalars, keyed as :func:`metric_names`);
  which result each one is: ``schema.HOOK_METRICS``."""
  out = {}
  for name, (_, source) in schema.HOOK_METRICS.items():
    group, key = source.split(".")
    x = fin[group][key]
    out.update({f"{name}_l{l}": x[l] for l in range(x.shape[0])} if name in _PER_LAYER else {name: x})
  return out


class EmergenceHook:
  """``hook(params) -> [{key: float}]``: the emergence metrics of the training parameters, one dict per run.

  Built once per run (it compiles there); ``params`` must have the shapes and
  shardings of ``params`` given to the constructor. ``num_runs = K > 0``: the
  params are K runs stacked on a leading seed axis (``train_seeds``), each
  evaluated on the same sequences in one vmapped call.
  """

  def __init__(self, config: ml_collections.ConfigDict, graphdef: nnx.GraphDef, params, mesh: Mesh,
               options: AnalysisOptions = AnalysisOptions(), num_runs: int = 0):
    self._started = time.perf_counter()
    spec = ModelSpec.from_config(config)
    n = config.train.emergence_sequences
    try:
      self.tokens = data.eval_sequences(config.data, num_sequences=n)[:, :-1]  # model inputs [N, T]
    except ValueError as e:
      raise ConfigError(f"config.train.emergence_sequences={n} is too large: {e}") from e
    seq_len = self.tokens.shape[1]
    visible = layer_visible(spec, seq_len)
    design = fixed_effects.make_design(visible)
    num_groups, x0_groups = fingerprint_groups({config.data.bos: self.tokens}, spec.vocab_size)

    def evaluate(params, tokens, seq_ids, visible, design, x0_groups):
      acc = init_core(spec, seq_len, options.num_blocks, num_groups)
      acc = make_core_step(graphdef, design, x0_groups)(params, acc, tokens, seq_ids)
      return metrics_from_core(finalize_core(acc, visible, design, options, keep=None))

    replicated = NamedSharding(mesh, PartitionSpec())
    # Every process holds the same values: a replicated global array (one or many processes).
    self._inputs = jax.tree.map(lambda x: jax.make_array_from_process_local_data(replicated, np.asarray(x)),
                                (self.tokens, np.arange(n, dtype=np.int32), visible, design, x0_groups))
    if num_runs:  # params stacked on a leading seed axis (train_seeds): one evaluation per run
      evaluate = jax.vmap(evaluate, in_axes=(0, None, None, None, None, None))
    self._num_runs = max(num_runs, 1)
    self._fn = jax.jit(evaluate, out_shardings=replicated).lower(params, *self._inputs).compile()
    self._spent = time.perf_counter() - self._started  # compilation counts as the hook's cost
    log.info("emergence hook: %d sequences, compiled in %.1f s", n, self._spent)

  def __call__(self, params) -> list[dict[str, float]]:
    """One metrics dict per run: a single one, or ``num_runs`` for params stacked on a seed axis."""
    jax.block_until_ready(params)  # time the hook, not training steps still in flight
    start = time.perf_counter()
    out = {k: np.reshape(v, (self._num_runs,)) for k, v in jax.device_get(self._fn(params, *self._inputs)).items()}
    seconds = time.perf_counter() - start
    self._spent += seconds
    timing = {"emergence_seconds": seconds, "emergence_fraction": self._spent / (time.perf_counter() - self._started)}
    return [{**{k: float(v[i]) for k, v in out.items()}, **timing} for i in range(self._num_runs)]
