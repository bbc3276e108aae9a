r"""Run one command as N local JAX processes that form one global mesh (try multi-host on one machine).

    python -m abspos_jax.launch --num_processes=2 --devices_per_process=4 -- \
        train.py --config=configs/tiny.py --workdir=runs/mh

Each process gets ``JAX_COORDINATOR_ADDRESS`` (a free loopback port),
``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` and, on the CPU, ``XLA_FLAGS`` forcing
``--devices_per_process`` devices; ``abspos_jax.distributed`` picks them up.
Output lines are forwarded with a ``[pI]`` prefix. If one process fails, the
others are stopped (SIGTERM, then SIGKILL after ``--grace_s``) and the launcher
exits with the failed process's status.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import portpicker
from absl import app, flags

_NUM = flags.DEFINE_integer("num_processes", 2, "Processes to start.")
_DEVICES = flags.DEFINE_integer("devices_per_process", 0, "Forced CPU devices per process (0: leave XLA_FLAGS).")
_GRACE = flags.DEFINE_float("grace_s", 10.0, "Seconds between SIGTERM and SIGKILL when stopping the others.")


def _forward(stream, prefix: str, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"{prefix}{line}")
    out.flush()


def launch(command: list[str], num_processes: int, devices_per_process: int = 0, grace_s: float = 10.0) -> int:
  """Start ``command`` ``num_processes`` times; return the first non-zero exit status, or 0."""
  if num_processes < 1:
    raise ValueError(f"--num_processes must be >= 1, got {num_processes}")
  if command and command[0].endswith(".py"):
    command = [sys.executable, *command]
  port = portpicker.pick_unused_port()
  procs, threads = [], []
  for i in range(num_processes):
    env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(num_processes),
               JAX_PROCESS_ID=str(i))
    if devices_per_process:
      env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices_per_process}"
    p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    procs.append(p)
    t = threading.Thread(target=_forward, args=(p.stdout, f"[p{i}] ", sys.stdout), daemon=True)
    t.start()
    threads.append(t)
  status = 0
  try:
    while [p.poll() for p in procs].count(None):  # a list, not any(): every process must be polled (reaped)
      failed = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode not in (None, 0)]
      if failed:
        i, status = failed[0]
        sys.stderr.write(f"launch: process {i} exited with status {status}; stopping the others\n")
        _stop(procs, grace_s)
        break
      time.sleep(0.1)
  except KeyboardInterrupt:
    _stop(procs, grace_s)
    status = 130
  for t in threads:
    t.join(timeout=5)
  if status == 0:
    status = next((p.returncode for p in procs if p.returncode), 0)
  return status


def _stop(procs, grace_s: float) -> None:
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.time() + grace_s
  for p in procs:
    try:
      p.wait(timeout=max(0.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def main(argv):
  command = argv[1:]
  if command and command[0] == "--":
    command = command[1:]
  if not command:
    sys.exit("usage: python -m abspos_jax.launch --num_processes=N [--devices_per_process=D] -- COMMAND ...")
  sys.exit(launch(command, _NUM.value, _DEVICES.value, _GRACE.value))


if __name__ == "__main__":
  app.run(main)
