"""The profile benchmark's op classifier: each XLA op of a compiled program lands in the right kind."""

import jax
import jax.numpy as jnp

from benchmarks.profile_step import xla_op_kinds


def test_op_kinds_of_a_compiled_program():
  def f(x, w, q, k):
    dense = jnp.tanh(x @ w)  # [64, 32] x [32, 48]: a dot without batch dimensions
    scores = jnp.einsum("bhtd,bhsd->bhts", q, k)  # batched over b, h
    return dense.T.copy() + 1.0, jnp.exp(scores)

  args = (jnp.ones((64, 32)), jnp.ones((32, 48)), jnp.ones((2, 3, 8, 4)), jnp.ones((2, 3, 8, 4)))
  kinds = xla_op_kinds(jax.jit(f).lower(*args).compile().as_text())
  by_shape = {}
  for kind, shape in kinds.values():
    by_shape.setdefault(shape, set()).add(kind)
  assert "dense matmul" in by_shape["f32[64,48]"]
  assert "attention matmul" in by_shape["f32[2,3,8,8]"]
  assert "layout copy" in by_shape["f32[48,64]"]
  assert set(k for k, _ in kinds.values()) <= {"dense matmul", "attention matmul", "layout copy", "elementwise"}
