"""Shared fixtures: small configs and an isolated data cache per test session."""

import atexit
import os
import shutil
import tempfile

# One persistent compilation cache for the whole run, this process, the xdist workers (which inherit the
# environment) and every train.py / analyze.py subprocess: most end-to-end tests compile the same small
# programs again in fresh processes. A run's own cache, removed at exit; a user's JAX_COMPILATION_CACHE_DIR
# is used as is. An unreadable entry (a process killed while writing it) is recompiled, not an error.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="abspos-jax-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

# Runs that several test modules read (helpers.shared_run) are built once per test run, in a directory every
# xdist worker sees (inherited like the cache above); removed at exit.
if "ABSPOS_TEST_SHARED" not in os.environ:
  os.environ["ABSPOS_TEST_SHARED"] = tempfile.mkdtemp(prefix="abspos-jax-shared-")
  atexit.register(shutil.rmtree, os.environ["ABSPOS_TEST_SHARED"], ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])

from abspos_jax.config import base_config  # noqa: E402


def xla_flags(*flags: str) -> str:
  """``XLA_FLAGS`` for a subprocess: ``flags`` plus the caller's own ``XLA_FLAGS``."""
  return " ".join((*flags, os.environ.get("XLA_FLAGS", ""))).strip()


@pytest.fixture(scope="session", autouse=True)
def _data_dir(tmp_path_factory):
  """Build datasets into a throwaway cache, never the user's."""
  if "ABSPOS_DATA_DIR" not in os.environ:
    os.environ["ABSPOS_DATA_DIR"] = str(tmp_path_factory.mktemp("tfds"))
  return os.environ["ABSPOS_DATA_DIR"]


def small_config(position: str = "rope", **overrides):
  """A model small enough to compile and run in a second or two on CPU."""
  c = base_config()
  c.model.position = position
  c.model.num_layers = 2
  c.model.d_model = 32
  c.model.num_heads = 4
  c.model.window = 4
  c.data.seq_len = 16
  c.train.batch_size = 8
  c.train.steps = 4
  c.train.warmup_steps = 1
  c.train.log_every = 1
  c.train.eval_every = 2
  c.train.progress = False
  c.train.emergence = False  # its compilation (~6 s CPU) per run; tests/test_emergence.py turns it on
  c.data.eval_sequences = 8
  c.checkpoint.every = 2
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return c
