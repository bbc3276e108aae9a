"""Seeds trained together (``train_seeds``: one vmapped step) == the same seeds trained one by one."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from abspos_jax import checkpoint, data, train_step
from abspos_jax.config import ConfigError
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import NonFiniteError, train, train_seeds
from conftest import small_config

SEEDS = [0, 1, 2]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def config(**overrides):
  return small_config(**{"train.steps": 6, **overrides})


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """Compile each program once: the runs here rebuild the same steps many times (speed only, same executables)."""
  from jax.experimental.compilation_cache import compilation_cache as cc
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  before = {name: getattr(jax.config, name) for name in names}
  jax.config.update("jax_compilation_cache_dir", str(tmp_path_factory.mktemp("jax_cache")))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  cc.reset_cache()  # the cache is switched on or off at a process's first compile
  yield
  for name, value in before.items():
    jax.config.update(name, value)
  cc.reset_cache()


def losses(workdir):
  return [m["loss"] for m in read_metrics(workdir)]


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
  """Each seed trained alone: ``{seed: (workdir, last metrics)}``."""
  root = tmp_path_factory.mktemp("separate")
  return {s: (root / f"s{s}", train(config(**{"train.seed": s}), str(root / f"s{s}"))) for s in SEEDS}


@pytest.fixture(scope="module")
def together(tmp_path_factory):
  """The same seeds trained together: ``(template, [last metrics])``."""
  template = str(tmp_path_factory.mktemp("together") / "s{seed}")
  return template, train_seeds(config(), template, SEEDS)


def run_dir(template, seed):
  return template.replace("{seed}", str(seed))


def test_together_matches_separate_runs(separate, together):
  template, lasts = together
  for seed, last in zip(SEEDS, lasts):
    alone_dir, alone = separate[seed]
    workdir = run_dir(template, seed)
    # an ordinary run directory: its own config (seed included), metrics, TensorBoard events, checkpoints
    assert sorted(os.listdir(workdir)) == sorted(os.listdir(alone_dir))
    assert json.loads(open(os.path.join(workdir, "config.json")).read()) == json.loads(
        open(os.path.join(alone_dir, "config.json")).read())
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4", "6"]
    for step in ("2", "4", "6"):  # its own data position and meta; arrays stored as one run stores them
      for name in ("data/metadata", "meta/metadata", "params/_METADATA", "params/_sharding", "opt_state/_METADATA",
                   "opt_state/_sharding"):
        assert (open(os.path.join(workdir, "checkpoints", step, name)).read()
                == open(os.path.join(alone_dir, "checkpoints", step, name)).read()), (step, name)
    a, b = read_metrics(alone_dir), read_metrics(workdir)
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6] and set(a[1]) == set(b[1])
    np.testing.assert_allclose(losses(workdir), losses(alone_dir), rtol=1e-5)
    np.testing.assert_allclose(last["val_loss"], alone["val_loss"], rtol=1e-5)
    _, model_a, step_a = checkpoint.load_model(str(alone_dir))
    _, model_b, step_b = checkpoint.load_model(workdir)
    assert step_a == step_b == 6
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7),
                 nnx.state(model_b, nnx.Param), nnx.state(model_a, nnx.Param))
  # the seeds really differ: their own initialisation and data order
  assert len({losses(run_dir(template, s))[0] for s in SEEDS}) == 3


def test_resume_equals_uninterrupted(tmp_path, together):
  """Stop, resume, then resume again after one run lost its newest checkpoint (a kill during a group save)."""
  template = str(tmp_path / "s{seed}")
  train_seeds(config(**{"train.stop_at_step": 2}), template, SEEDS)
  train_seeds(config(**{"train.stop_at_step": 4}), template, SEEDS)
  assert [m["step"] for m in read_metrics(run_dir(template, 1))] == [1, 2, 3, 4]
  shutil.rmtree(os.path.join(run_dir(template, 1), "checkpoints", "4"))
  lasts = train_seeds(config(), template, SEEDS)  # all three resume from step 2, the newest they share
  for seed, last, whole in zip(SEEDS, lasts, together[1]):
    workdir = run_dir(template, seed)
    assert losses(workdir) == losses(run_dir(together[0], seed))
    assert last["val_loss"] == whole["val_loss"]
    moved = os.listdir(os.path.join(workdir, "unshared_checkpoints")) if seed != 1 else []
    assert len(moved) == (seed != 1) and all(m.startswith("4-") for m in moved)


def test_bad_templates_seeds_and_workdirs_are_refused(tmp_path, together):
  with pytest.raises(ConfigError, match=r"--workdir must contain the literal \{seed\}"):
    train_seeds(config(), str(tmp_path / "run"), SEEDS)
  with pytest.raises(ConfigError, match=r"--seeds must list distinct seeds; \[1\]"):
    train_seeds(config(), str(tmp_path / "s{seed}"), [0, 1, 1])
  with pytest.raises(ConfigError, match=r"--seeds must be integers in \[0, 2\*\*32\)"):
    train_seeds(config(), str(tmp_path / "s{seed}"), [-1])
  assert not os.listdir(tmp_path)
  template = together[0]
  with pytest.raises(ConfigError, match=r"(?s)s0 holds a run with a different config.*model\.num_layers: stored 2, now 3"):
    train_seeds(config(**{"model.num_layers": 3}), template, SEEDS)
  with pytest.raises(ConfigError, match=r"(?s)s1 holds a run with a different config"):
    train_seeds(config(**{"model.num_layers": 3}), template, [5, 1])  # nothing written to the new s5 either
  assert not os.listdir(run_dir(template, 5))
  os.rmdir(run_dir(template, 5))
  before = {s: sorted(os.listdir(os.path.join(run_dir(template, s), "checkpoints"))) for s in SEEDS}
  with pytest.raises(ConfigError, match=r"(?s)share no checkpoint step.*s3: none.*up to step 6"):
    train_seeds(config(), template, [0, 1, 3])  # a seed swapped into a trained group
  assert before == {s: sorted(os.listdir(os.path.join(run_dir(template, s), "checkpoints"))) for s in SEEDS}
  assert [m["step"] for m in read_metrics(run_dir(template, 0))] == [1, 2, 3, 4, 5, 6]
  shutil.rmtree(run_dir(template, 3))


def test_cli_refuses_a_bad_seed_list(tmp_path):
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}/s{{seed}}",
                      "--seeds=0,x"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "error: --seeds must be comma-separated integers" in r.stderr, r.stderr[-1500:]
  assert not os.listdir(tmp_path)


def poison(monkeypatch, seed, step):
  """Make the loss NaN on the ``step``-th training batch of ``seed`` (identified by its tokens)."""
  c = config(**{"train.seed": seed})
  it = data.train_iterator(c.data, batch_size=c.train.batch_size, seed=seed)
  batch = [next(it)["tokens"] for _ in range(step)][-1]
  target_sum = int(batch[:, 1:].sum())
  clean = train_step.lm_loss
  monkeypatch.setattr(train_step, "lm_loss", lambda logits, targets: clean(logits, targets) * jnp.where(
      targets.sum() == target_sum, jnp.nan, 1.0))


@pytest.mark.slow
def test_nonfinite_seed_leaves_the_others_alone(tmp_path, monkeypatch, together):
  poison(monkeypatch, 1, 3)
  with pytest.raises(NonFiniteError, match=r"at step 3 of seed 1 \(.*s1\): .* the last checkpoint \(step 2\)"):
    train_seeds(config(), str(tmp_path / "stop-s{seed}"), SEEDS)
  lasts = train_seeds(config(**{"train.nonfinite": "skip"}), str(tmp_path / "skip-s{seed}"), SEEDS)
  assert [last["skipped_steps"] for last in lasts] == [0, 1, 0]
  for seed in (0, 2):
    np.testing.assert_allclose(losses(tmp_path / f"skip-s{seed}"), losses(run_dir(together[0], seed)), rtol=1e-6)
  skipped = losses(tmp_path / "skip-s1")
  assert np.isnan(skipped[2]) and np.isfinite(skipped[3:]).all()
  assert skipped[:2] == losses(run_dir(together[0], 1))[:2]
