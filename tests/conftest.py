"""Shared fixtures: small configs and an isolated data cache per test session."""

import atexit
import os
import shutil
import tempfile

# One persistent compilation cache for the whole run, this process, the xdist workers (which inherit the
# environment) and every train.py / analyze.py subprocess: most end-to-end tests compile the same small
# programs again in fresh processes. A run's own cache, removed at exit; a user's JAX_COMPILATION_CACHE_DIR
# is used as is. An unreadable entry (a process killed while writing it) is recompiled, not an error.
# Every program is cached, not only those that took over a second to compile (jax's default): a fresh process
# otherwise recompiles a few hundred small ones (a sharded checkpoint's slicing alone takes 3 s of a 4-step run).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="abspos-jax-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
SESSION_CACHE = os.environ["JAX_COMPILATION_CACHE_DIR"]

# Runs that several test modules read (helpers.shared_run) are built once per test run, in a directory every
# xdist worker sees (inherited like the cache above); removed at exit.
if "ABSPOS_TEST_SHARED" not in os.environ:
  os.environ["ABSPOS_TEST_SHARED"] = tempfile.mkdtemp(prefix="abspos-jax-shared-")
  atexit.register(shutil.rmtree, os.environ["ABSPOS_TEST_SHARED"], ignore_errors=True)

# The suite's programs are tiny, so compiling them costs far more than running them, and most of a compile is
# LLVM optimising the generated code (README, "Tests"). Set here, before jax is imported, so that the
# xdist workers and every subprocess inherit it (the compilation cache keys on XLA_FLAGS, so no program compiled
# at another level is reused). Tests that check numbers the docs state run at the default level
# (:func:`default_level_env`).
FAST_COMPILE = "--xla_backend_optimization_level=0"
if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = f"{FAST_COMPILE} {os.environ.get('XLA_FLAGS', '')}".strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))

from abspos_jax.config import base_config  # noqa: E402


def xla_flags(*flags: str) -> str:
  """``XLA_FLAGS`` for a subprocess: ``flags`` plus the caller's own ``XLA_FLAGS``."""
  return " ".join((*flags, os.environ.get("XLA_FLAGS", ""))).strip()


def default_level_env() -> dict[str, str]:
  """The environment for a subprocess whose numbers the docs state: XLA's default optimisation level (the level
  users run at, and what a 100-step run needs to be fast)."""
  return {**os.environ, "XLA_FLAGS": os.environ["XLA_FLAGS"].replace(FAST_COMPILE, "").strip()}


@pytest.fixture(scope="session", autouse=True)
def _data_dir(tmp_path_factory):
  """Build datasets into a throwaway cache, never the user's."""
  if "ABSPOS_DATA_DIR" not in os.environ:
    os.environ["ABSPOS_DATA_DIR"] = str(tmp_path_factory.mktemp("tfds"))
  return os.environ["ABSPOS_DATA_DIR"]


# The suite's one small configuration (2 layers x 32 wide, 16 tokens, 4 steps of 8 sequences of the synthetic
# corpus), as overrides of configs/base.py: in-process tests take it through small_config(), train.py subprocesses
# through small_flags(), sweeps as it is. The emergence hook is off (its compilation costs ~6 s of CPU per run);
# the tests of the hook turn it on.
SMALL = {
    "model": {"num_layers": 2, "d_model": 32, "num_heads": 4, "window": 4},
    "data": {"seq_len": 16, "name": "synthetic", "synthetic_docs": 200, "eval_sequences": 8},
    "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1, "log_every": 1, "eval_every": 2, "progress": False,
              "emergence": False},
    "checkpoint": {"every": 2},
}


def _small(overrides: dict) -> dict:
  """SMALL as ``{"section.field": value}`` with ``overrides`` on top; a value of None drops the field."""
  flat = {f"{section}.{k}": v for section, fields in SMALL.items() for k, v in fields.items()}
  return {k: v for k, v in {**flat, **overrides}.items() if v is not None}


def small_config(position: str = "rope", **overrides):
  """SMALL as a config, with ``overrides`` (``{"section.field": value}``)."""
  c = base_config()
  c.model.position = position
  for key, value in _small(overrides).items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def small_flags(*flags: str, **overrides) -> list[str]:
  """SMALL as train.py flags (``--config.section.field=value``), with ``overrides`` and then ``flags`` on top, each
  field once."""
  out = {k: f"--config.{k}={v}" for k, v in _small(overrides).items()}
  for flag in flags:
    out[flag.split("=", 1)[0].removeprefix("--config.") if flag.startswith("--config.") else flag] = flag
  return list(out.values())


def pytest_collection_modifyitems(items: list) -> None:
  """Modules with slow (end-to-end) tests first, and those tests first within them: xdist hands tests out in
  this order, so a long test does not start last and leave one worker running alone at the end. Each module's
  tests stay together, so module-scoped fixtures are set up once per worker."""
  slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
  module_order = {}
  for item in items:
    module_order.setdefault(item.module.__name__, len(module_order))
  items.sort(key=lambda item: (item.module.__name__ not in slow_modules, module_order[item.module.__name__],
                               item.get_closest_marker("slow") is None))  # stable: collection order otherwise
