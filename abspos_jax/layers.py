"""Small building blocks of the Llama-style decoder: RMSNorm and SwiGLU MLP.

Parameters carry ``logical_axes`` metadata; :mod:`abspos_jax.sharding` maps those
names to mesh axes with the rules in ``config.mesh.rules``.
"""

import jax
import jax.numpy as jnp
from flax import nnx


def param(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str, ...], std: float, dtype) -> nnx.Param:
  """A normal(0, std) parameter tagged with logical axis names."""
  return nnx.Param(std * jax.random.normal(rngs.params(), shape, dtype), logical_axes=axes)


class RMSNorm(nnx.Module):
  """``y = x / sqrt(mean(x^2) + eps) * scale``, computed in float32."""

  def __init__(self, dim: int, *, eps: float, param_dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype), logical_axes=("norm",))
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)


class SwiGLU(nnx.Module):
  """``down(silu(x W_gate) * (x W_up))``, no biases."""

  def __init__(self, d_model: int, hidden: int, *, std: float, out_std: float, param_dtype, dtype, rngs: nnx.Rngs):
    self.gate = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.up = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.down = param(rngs, (hidden, d_model), ("mlp", "embed"), out_std, param_dtype)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x.astype(self.dtype)
    g = x @ self.gate[...].astype(self.dtype)
    u = x @ self.up[...].astype(self.dtype)
    return (jax.nn.silu(g) * u) @ self.down[...].astype(self.dtype)
