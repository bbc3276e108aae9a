"""K seeds of one config trained together: run directories per seed, and the stacked state of the loop.

``train_seeds`` (``train_loop``) stacks params and optimizer state on a leading
seed axis and runs ``jax.vmap`` of the one-run step; :class:`SeedAxis` is how
the loop holds, splits and joins that state, and :func:`seed_workdirs` names
each seed's run directory.
"""

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax import checkpoint, sharding
from abspos_jax import config as config_lib

WORKDIR_PLACEHOLDER = "{seed}"  # in a --workdir template, replaced by each seed


def seed_workdirs(workdir_template: str, seeds: Sequence[int]) -> list[str]:
  """``workdir_template`` with its literal ``{seed}`` replaced by each seed; refuses bad templates and seed lists."""
  if WORKDIR_PLACEHOLDER not in workdir_template:
    raise config_lib.ConfigError(
        f"--workdir must contain the literal {WORKDIR_PLACEHOLDER} when --seeds is given (one run directory per "
        f"seed, e.g. runs/rope-s{WORKDIR_PLACEHOLDER}), got {workdir_template!r}")
  if not seeds:
    raise config_lib.ConfigError("--seeds must list at least one seed, e.g. --seeds=0,1,2")
  repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
  if repeated:
    raise config_lib.ConfigError(f"--seeds must list distinct seeds; {repeated} appear more than once in {list(seeds)}")
  bad = [s for s in seeds if not 0 <= s < 2**32]
  if bad:
    raise config_lib.ConfigError(f"--seeds must be integers in [0, 2**32), got {bad}")
  return [workdir_template.replace(WORKDIR_PLACEHOLDER, str(s)) for s in seeds]


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
