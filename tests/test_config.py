"""Config validation: every refusal names the field and what is allowed."""

import os
import subprocess
import sys

import pytest

from abspos_jax.config import ConfigError, data_parallel_size, diff, load_config_file, to_dict, validate
from conftest import small_config


def refused(config, match, num_devices=1):
  with pytest.raises(ConfigError, match=match):
    validate(config, num_devices)


@pytest.mark.parametrize("name", ["base", "rope", "ntk", "swa", "nope", "learned", "tiny", "sinks_cpu"])
def test_shipped_configs_are_valid(name):
  validate(load_config_file(f"configs/{name}.py"), num_devices=1)


def test_unknown_field():
  c = small_config()
  with c.unlocked():
    c.model.d_modle = 3
  refused(c, r"unknown config field config\.model\.d_modle")


def test_unknown_position():
  refused(small_config("alibi"), r"config\.model\.position must be one of rope, ntk, swa, nope, learned")


def test_heads_must_divide_d_model():
  refused(small_config(**{"model.num_heads": 5}), r"config\.model\.num_heads must divide model\.d_model=32")


def test_rope_needs_even_head_dim():
  refused(small_config(**{"model.d_model": 36, "model.num_heads": 4}), r"num_heads must leave an even head dim")
  validate(small_config("nope", **{"model.d_model": 36, "model.num_heads": 4}), 1)


def test_window_at_least_one():
  refused(small_config("swa", **{"model.window": 0}), r"config\.model\.window must be >= 1")


def test_ntk_alpha_positive():
  refused(small_config("ntk", **{"model.ntk_alpha": 0.0}), r"config\.model\.ntk_alpha must be > 0")


def test_bos_policy():
  refused(small_config(**{"data.bos": "always"}), r"config\.data\.bos must be one of prepend, none")


def test_seed_range():
  refused(small_config(**{"train.seed": -1}), r"config\.train\.seed must be in \[0, 2\*\*32\), got -1")
  refused(small_config(**{"train.seed": 2**32}), r"config\.train\.seed must be in")
  validate(small_config(**{"train.seed": 2**32 - 1}), 1)


def test_batch_divisible_by_data_parallel_size():
  refused(small_config(**{"train.batch_size": 6}), r"config\.train\.batch_size .* data-parallel size 4",
          num_devices=4)
  refused(small_config(**{"train.batch_size": 8, "train.grad_accum": 3}), r"config\.train\.grad_accum must divide")


def test_data_parallel_size_follows_the_batch_rule():
  """The batch splits over the mesh axes ``mesh.rules`` maps ``batch`` to, not over every data or fsdp axis."""
  sizes = {"data": 2, "fsdp": 4}
  assert data_parallel_size(sizes, (("batch", ("data", "fsdp")),)) == 8
  assert data_parallel_size(sizes, (("batch", "data"),)) == 2
  assert data_parallel_size(sizes, (("batch", ("data", "tensor")),)) == 2  # tensor is not in the mesh
  assert data_parallel_size(sizes, (("batch", None),)) == 1
  c = small_config(**{"train.batch_size": 6})
  c.mesh.shape, c.mesh.axes = (2, 4), ("data", "fsdp")
  refused(c, r"data-parallel size 8", num_devices=8)
  c.mesh.rules = (("batch", "data"),) + tuple(r for r in c.mesh.rules if r[0] != "batch")
  validate(c, 8)  # 6 sequences split 2 ways: the fsdp axis holds parameters only


def test_mesh_must_match_devices():
  c = small_config()
  c.mesh.shape, c.mesh.axes = (2, 2), ("data", "tensor")
  refused(c, r"config\.mesh\.shape must multiply to the device count 8", num_devices=8)
  c.mesh.shape, c.mesh.axes = (2, -1), ("data", "model")
  refused(c, r"config\.mesh\.axes must be distinct names from data, fsdp, tensor", num_devices=8)


def test_kv_heads_must_divide_heads():
  refused(small_config(**{"model.num_kv_heads": 3}), r"config\.model\.num_kv_heads must be 0 \(= num_heads\) or divide")
  refused(small_config(**{"model.num_kv_heads": -1}), r"config\.model\.num_kv_heads")
  validate(small_config(**{"model.num_kv_heads": 2, "model.qkv_bias": True}), 1)


def test_norm_eps_positive():
  refused(small_config(**{"model.norm_eps": 0.0}), r"config\.model\.norm_eps must be > 0")


def test_diff_takes_fields_added_later_at_their_default():
  """A run saved before a field existed resumes: the missing field counts as its (behaviour-keeping) default."""
  stored = to_dict(small_config())
  del stored["model"]["num_kv_heads"], stored["model"]["qkv_bias"]
  assert diff(stored, to_dict(small_config())) == []
  assert diff(stored, to_dict(small_config(**{"model.num_kv_heads": 2}))) == [("model.num_kv_heads", 0, 2)]


def test_text_files_need_files():
  refused(small_config(**{"data.name": "text_files"}), r"config\.data\.files must list paths")


def test_diff_ignores_resumable_fields():
  a, b = small_config(), small_config(**{"train.log_every": 7, "model.num_layers": 3})
  assert diff(to_dict(a), to_dict(b)) == [("model.num_layers", 2, 3)]


def test_cli_refuses_unknown_override_before_compiling(tmp_path):
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                      "--config.model.windw=3"], capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "windw" in r.stderr
  r = subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={tmp_path}",
                      "--config.model.position=alibi"], capture_output=True, text=True, timeout=120)
  assert r.returncode != 0 and "config.model.position must be one of" in r.stderr
  assert not (tmp_path / "checkpoints").exists()


def test_each_field_is_declared_once_and_the_docs_follow_the_declarations():
  from abspos_jax import config as config_lib
  fields = config_lib._base_module().FIELDS
  names = [f.name for f in fields]
  assert len(names) == len(set(names))
  assert sorted(names) == sorted(n for n, _ in config_lib.flatten(config_lib.base_config()))
  assert "train.log_every" in config_lib.resumable_fields() and "model.d_model" not in config_lib.resumable_fields()
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(repo, "docs", "config.md")) as f:
    assert f.read() == config_lib.fields_markdown(), "docs/config.md is stale: run python -m abspos_jax.config"
  with open(os.path.join(repo, "README.md")) as f:
    readme = f.read()
  assert f"{config_lib.README_BEGIN}\n{config_lib.key_fields_text()}\n{config_lib.README_END}" in readme, (
      "README's key fields are stale: run python -m abspos_jax.config")


def test_declared_checks_name_the_field():
  refused(small_config(**{"model.window": 0}), r"config\.model\.window must be >= 1 \(keys visible to a query")
  refused(small_config(**{"model.dtype": "float16"}), r"config\.model\.dtype must be one of float32, bfloat16")
  refused(small_config(**{"model.rope_base": 0.0}), r"config\.model\.rope_base must be > 0, got 0\.0")
  refused(small_config(**{"train.emergence_sequences": 1}),
          r"config\.train\.emergence_sequences must be >= 2 \(the held-out leakage needs two halves\)")
  c = small_config()
  with c.ignore_type():
    c.data.shuffle = 1
  refused(c, r"config\.data\.shuffle must be True or False, got 1")
