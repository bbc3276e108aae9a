"""Multi-process (multi-host) start-up: ``jax.distributed.initialize`` from config or environment.

One JAX process runs per host (TPU pod worker, SLURM task, or a local process
started by :mod:`abspos_jax.launch`); together they form one global mesh.
Where the coordinator, process count and id come from, first found wins:

1. ``config.distributed.coordinator_address`` / ``num_processes`` / ``process_id``;
2. the environment: ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``
   (what the local launcher sets);
3. JAX's own cluster detection (TPU pods, SLURM, Open MPI, ...), when none is given.

On the CPU backend the collectives go through gloo.
"""

import os

import jax
import ml_collections

ENV_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def requested(config: ml_collections.ConfigDict | None = None) -> bool:
  """True when this process should join a multi-process run."""
  return bool((config is not None and config.distributed.enabled) or os.environ.get("JAX_NUM_PROCESSES"))


def initialize(config: ml_collections.ConfigDict | None = None) -> None:
  """Join the run (idempotent); call before anything touches a JAX backend."""
  if jax.distributed.is_initialized():
    return
  d = config.distributed if config is not None else None
  address = (d.coordinator_address if d is not None and d.coordinator_address else None) or \
      os.environ.get("JAX_COORDINATOR_ADDRESS")
  num = (d.num_processes if d is not None and d.num_processes > 0 else None) or \
      (int(os.environ["JAX_NUM_PROCESSES"]) if os.environ.get("JAX_NUM_PROCESSES") else None)
  pid = (d.process_id if d is not None and d.process_id >= 0 else None)
  if pid is None and os.environ.get("JAX_PROCESS_ID"):
    pid = int(os.environ["JAX_PROCESS_ID"])
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=address, num_processes=num, process_id=pid)


def is_writer() -> bool:
  """Process 0 writes config, metrics, reports; the others compute only."""
  return jax.process_index() == 0
