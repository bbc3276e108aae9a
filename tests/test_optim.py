"""The optimizer (optim.py): the learning-rate schedule's shape, and weight decay on matrices only."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax.optim import decay_mask, learning_rate_schedule, make_optimizer
from conftest import small_config


def test_schedule_warms_up_linearly_then_decays_by_a_cosine_to_its_floor():
  t = small_config(**{"train.steps": 100, "train.warmup_steps": 10, "train.learning_rate": 1e-2,
                      "train.end_lr_fraction": 0.1}).train
  lr = learning_rate_schedule(t)
  np.testing.assert_allclose([float(lr(s)) for s in (0, 5, 10)], [0.0, 5e-3, 1e-2], rtol=1e-6)
  # Half-way through the decay the cosine is at its midpoint: floor + (peak - floor) / 2.
  np.testing.assert_allclose(float(lr(55)), 1e-3 + 0.5 * 9e-3, rtol=1e-5)
  np.testing.assert_allclose(float(lr(100)), 1e-3, rtol=1e-6)
  decay = [float(lr(s)) for s in range(10, 101)]
  assert all(a >= b for a, b in zip(decay, decay[1:]))
  # A warmup longer than the run is cut to steps - 1: the peak is still reached, and the floor at the end.
  short = small_config(**{"train.steps": 4, "train.warmup_steps": 10, "train.learning_rate": 3e-3}).train
  lr = learning_rate_schedule(short)
  np.testing.assert_allclose([float(lr(s)) for s in (1, 3, 4)], [1e-3, 3e-3, 3e-4], rtol=1e-6)


def _params():
  model = model_lib.create(small_config(**{"model.qkv_bias": True}))
  return nnx.state(model, nnx.Param).to_pure_dict()


def _names(tree):
  return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_decay_mask_takes_matrices_and_leaves_norms_and_biases():
  params = _params()
  mask, shapes = _names(decay_mask(params)), _names(params)
  for name, decays in mask.items():
    is_bias = any(f"'{b}'" in name for b in ("bq", "bk", "bv"))
    assert decays == (shapes[name].ndim >= 2 and not is_bias), name
  assert any(mask.values()) and not all(mask.values())
  assert any(any(f"'{b}'" in n for b in ("bq", "bk", "bv")) and shapes[n].ndim == 2 for n in mask)  # 2-D, not decayed


def test_a_step_with_zero_gradients_decays_only_the_masked_parameters():
  """Adam's update of a zero gradient is zero, so one step moves exactly the decayed parameters, by lr * wd * p."""
  t = small_config(**{"train.warmup_steps": 0, "train.learning_rate": 1e-2, "train.weight_decay": 0.5}).train
  params = _params()
  tx = make_optimizer(t)
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  lr = float(learning_rate_schedule(t)(0))
  np.testing.assert_allclose(lr, 1e-2, rtol=1e-6)  # no warmup: the peak at the first step
  mask, ups, ps = _names(decay_mask(params)), _names(updates), _names(params)
  for name, decays in mask.items():
    expected = -lr * t.weight_decay * ps[name] if decays else np.zeros_like(ps[name])
    np.testing.assert_allclose(ups[name], expected, rtol=1e-6, atol=1e-12, err_msg=name)
