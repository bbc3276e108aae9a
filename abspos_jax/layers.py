"""Small building blocks of the Llama-style decoder: RMSNorm and SwiGLU MLP.

Parameters carry ``logical_axes`` metadata; :mod:`abspos_jax.sharding` maps those
names to mesh axes with the rules in ``config.mesh.rules``.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from abspos_jax import precision


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
  """``down(silu(x W_gate) * (x W_up))``, no biases; products in :func:`precision.einsum` (float32 out)."""

  def __init__(self, d_model: int, hidden: int, *, std: float, out_std: float, param_dtype, dtype, rngs: nnx.Rngs):
    self.gate = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.up = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.down = param(rngs, (hidden, d_model), ("mlp", "embed"), out_std, param_dtype)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    # One product for gate and up (a wider matmul runs nearer the CPU's peak than two narrow ones).
    w = jnp.concatenate([self.gate[...], self.up[...]], axis=1)
    g, u = jnp.split(precision.einsum("...d,df->...f", x, w, self.dtype), 2, axis=-1)
    return precision.einsum("...f,fd->...d", jax.nn.silu(g) * u, self.down[...], self.dtype)
