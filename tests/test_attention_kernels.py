"""The training attention kernels (abspos_jax/attention_kernels.py): the choice, the refusals, and each kernel
against the explicit path (output and gradients, float32) on the CPU."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import attention_kernels as kernels
from abspos_jax import model as model_lib
from abspos_jax.attention import softmax_attention
from abspos_jax.rope import apply_rope, ntk_base
from abspos_jax.train_loop import train
from conftest import small_config

B, T, H, D = 2, 128, 4, 16


def test_auto_is_the_explicit_path_on_this_cpu():
  assert jax.default_backend() == "cpu"
  assert kernels.resolve("auto", dtype="bfloat16", head_dim=64, seq_len=1024) == "xla"
  m_auto = model_lib.create(small_config(**{"model.attention_impl": "auto"}))
  m_xla = model_lib.create(small_config())
  x = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
  np.testing.assert_array_equal(m_auto(x), m_xla(x))


@pytest.mark.parametrize("facts, expected", [
    (dict(platform="gpu", capability=9.0, dtype="bfloat16", head_dim=64), "cudnn"),
    (dict(platform="gpu", capability=8.0, dtype="float16", head_dim=128), "cudnn"),
    (dict(platform="gpu", capability=9.0, dtype="float32", head_dim=64), "xla"),  # cuDNN flash needs half
    (dict(platform="gpu", capability=7.5, dtype="bfloat16", head_dim=64), "xla"),  # pre-Ampere
    (dict(platform="gpu", capability=9.0, dtype="bfloat16", head_dim=160), "xla"),  # head_dim > 128
    (dict(platform="tpu", capability=0.0, dtype="bfloat16", head_dim=64), "splash"),
    (dict(platform="tpu", capability=0.0, dtype="bfloat16", head_dim=64, seq_len=200), "xla"),  # not 128k
])
def test_auto_picks_the_fused_kernel_where_it_applies(facts, expected):
  facts = {"seq_len": 1024, **facts}
  assert kernels.resolve("auto", **facts) == expected


@pytest.mark.parametrize("impl, reason", [("cudnn", "needs an NVIDIA GPU"), ("splash", "needs a TPU")])
def test_an_accelerator_kernel_is_refused_here_before_any_work(tmp_path, impl, reason):
  with pytest.raises(ValueError, match=rf"model.attention_impl='{impl}' cannot run here: it {reason}.*'cpu'.*auto"):
    train(small_config(**{"model.attention_impl": impl}), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
  with pytest.raises(ValueError, match="model.attention_impl='flash': must be one of xla, cudnn, splash"):
    kernels.resolve("flash", dtype="float32", head_dim=8, seq_len=16)
  with pytest.raises(ValueError, match="needs model.dtype bfloat16"):
    kernels.resolve("cudnn", dtype="float32", head_dim=64, seq_len=16, platform="gpu", capability=9.0)


def _inputs(kv_heads: int, base: float | None):
  """q, k, v on our layout; with ``base``, q and k after RoPE of that base (what the model feeds a kernel)."""
  q, k, v = (jax.random.normal(jax.random.key(i), (B, T, h, D)) for i, h in enumerate((H, kv_heads, kv_heads)))
  if base is not None:
    positions = np.arange(T)
    q, k = apply_rope(q, positions, base), apply_rope(k, positions, base)
  return q, k, v


def _value_and_grads(fn, q, k, v):
  """The output and the gradients of ``sum(out * w)`` for a fixed random ``w``."""
  w = jax.random.normal(jax.random.key(9), (B, T, H, D))
  out = fn(q, k, v)
  return out, jax.grad(lambda q, k, v: (fn(q, k, v) * w).sum(), argnums=(0, 1, 2))(q, k, v)


CASES = [  # (position, window, kv heads): rope, ntk and swa, windows under and over T, MHA, GQA and MQA
    ("rope", None, H), ("rope", None, 2), ("ntk", None, 1), ("swa", 16, H), ("swa", 16, 2), ("swa", 3 * T, 1)]


def _base(position: str) -> float:
  return ntk_base(10_000.0, 4.0, D) if position == "ntk" else 10_000.0


@pytest.mark.parametrize("position, window, kv_heads", CASES)
def test_jax_dot_product_attention_equals_ours(position, window, kv_heads):
  """The call the cudnn kernel makes, with implementation="xla": the same output and gradients within 1e-5."""
  q, k, v = _inputs(kv_heads, _base(position))
  positions = np.arange(T)
  ours = _value_and_grads(lambda q, k, v: softmax_attention(q, k, v, positions, window), q, k, v)
  theirs = _value_and_grads(lambda q, k, v: kernels.dot_product(q, k, v, window, jnp.float32, "xla"), q, k, v)
  for a, b in zip(jax.tree.leaves(theirs), jax.tree.leaves(ours)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position, window, kv_heads", [CASES[1], CASES[2], CASES[4], CASES[5]])
def test_splash_attention_in_interpret_mode_equals_ours(position, window, kv_heads):
  """The splash kernel (Pallas, run in interpret mode on this CPU): the same output and gradients."""
  q, k, v = _inputs(kv_heads, _base(position))
  positions = np.arange(T)
  ours = _value_and_grads(lambda q, k, v: softmax_attention(q, k, v, positions, window), q, k, v)
  theirs = _value_and_grads(lambda q, k, v: kernels.splash(q, k, v, window, jnp.float32, interpret=True),
                            q, k, v)
  for a, b in zip(jax.tree.leaves(theirs), jax.tree.leaves(ours)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_the_kernel_is_recorded_in_the_first_metrics_record(tmp_path):
  train(small_config(**{"model.attention_impl": "auto", "train.steps": 2}), str(tmp_path))
  first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
  assert first["provenance"]["attention_kernel"] == "xla"


GPU = pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's kernel needs an NVIDIA GPU")


@GPU
@pytest.mark.parametrize("position, window, kv_heads", CASES)
def test_cudnn_equals_xla_in_bfloat16(position, window, kv_heads):
  """On a GPU: cuDNN's flash attention against JAX's XLA reference, both in bf16, within JAX's own tolerance
  for this comparison (1e-2), output and gradients."""
  q, k, v = _inputs(kv_heads, _base(position))
  got = {impl: _value_and_grads(lambda q, k, v, i=impl: kernels.dot_product(q, k, v, window, jnp.bfloat16, i),
                                q, k, v) for impl in ("cudnn", "xla")}
  for a, b in zip(jax.tree.leaves(got["cudnn"]), jax.tree.leaves(got["xla"])):
    np.testing.assert_allclose(a, b, atol=1e-2, rtol=1e-2)


def _curves(position: str, impls: tuple[str, ...], steps: int) -> dict[str, np.ndarray]:
  """bf16 training losses of a 4 x 256 model on stdlib text (T 256, batch 16) per kernel, from the same weights
  and the same 20 batches in turn."""
  from flax import nnx

  from abspos_jax import data, optim, train_step

  losses = {}
  for impl in impls:
    c = small_config(position, **{"model.attention_impl": impl, "model.dtype": "bfloat16", "model.num_layers": 4,
                                  "model.d_model": 256, "model.num_heads": 4, "model.window": 64,
                                  "data.name": "stdlib_text", "data.seq_len": 256, "train.batch_size": 16,
                                  "train.steps": steps, "train.learning_rate": 3e-3})
    graphdef, params = nnx.split(model_lib.create(c), nnx.Param)
    tx = optim.make_optimizer(c.train)
    step = jax.jit(train_step.make_train_step(graphdef, tx))
    batches = data.eval_sequences(c.data, num_sequences=16 * 20).reshape(20, 16, -1)
    opt_state, curve = tx.init(params), []
    for i in range(steps):
      params, opt_state, m = step(params, opt_state, jnp.asarray(batches[i % 20]))
      curve.append(float(m["loss"]))
    losses[impl] = np.array(curve)
  return losses


@GPU
@pytest.mark.parametrize("position", ["rope", "swa"])
def test_200_training_steps_with_cudnn_track_xla(position):
  """On a GPU: 200 steps with cuDNN against the explicit path (:func:`_curves`). Different kernels round
  differently, so the curves drift apart; the mean loss of the last 50 steps must agree within 0.02 nats
  (about 1% of the loss there)."""
  losses = _curves(position, ("cudnn", "xla"), 200)
  assert abs(losses["cudnn"][0] - losses["xla"][0]) < 1e-2 * losses["xla"][0]
  assert abs(losses["cudnn"][-50:].mean() - losses["xla"][-50:].mean()) < 0.02, losses

