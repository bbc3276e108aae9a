"""Small building blocks of the Llama-style decoder: RMSNorm and SwiGLU MLP.

Parameters carry ``logical_axes`` metadata; :mod:`abspos_jax.sharding` maps those
names to mesh axes with the rules in ``config.mesh.rules``.
"""

import functools

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


def swiglu(x: jax.Array, w_gate_up: jax.Array, w_down: jax.Array, dtype=jnp.float32) -> jax.Array:
  """``out [..., D] = (silu(g) * u) W_down`` with ``[g, u] = x [W_gate, W_up]`` (float32 out).

  ``x [..., D]``, ``w_gate_up [D, 2F]`` (gate then up), ``w_down [F, D]``;
  products take ``dtype`` inputs and accumulate in float32
  (:mod:`abspos_jax.precision`). The backward is written by hand, with
  ``h = [g, u]``, ``s = sigmoid(g)``, ``act = g s u`` and ``dO`` the output's
  cotangent::

      dact = dO W_down^T                  dW_down = act^T dO
      dg = dact u s (1 + g (1 - s))       du = dact g s
      dx = [dg, du] W_gate_up^T           dW_gate_up = x^T [dg, du]

  so that ``[dg, du]`` is written once, in ``dtype``, for both products
  (autodiff wrote it in float32, concatenated and cast it in separate
  passes). It keeps ``x``, ``h`` and ``act`` in ``dtype`` (for bfloat16 as
  PyTorch's autocast keeps its matmul outputs); ``dg`` and ``du`` are
  computed in float32 from them (the effect on the step:
  ``docs/benchmarks.md``).
  """
  return _swiglu(x, w_gate_up, w_down, jnp.dtype(dtype))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _swiglu(x, w_gate_up, w_down, dtype):
  return _swiglu_fwd(x, w_gate_up, w_down, dtype)[0]


def _swiglu_fwd(x, w_gate_up, w_down, dtype):
  x, w_gate_up, w_down = x.astype(dtype), w_gate_up.astype(dtype), w_down.astype(dtype)
  h = jnp.einsum("...d,df->...f", x, w_gate_up, preferred_element_type=jnp.float32)
  g, u = jnp.split(h, 2, axis=-1)
  act = (jax.nn.silu(g) * u).astype(dtype)
  out = jnp.einsum("...f,fd->...d", act, w_down, preferred_element_type=jnp.float32)
  return out, (x, w_gate_up, w_down, h.astype(dtype), act)


def _swiglu_bwd(dtype, residuals, d_out):
  x, w_gate_up, w_down, h, act = residuals
  d_out = d_out.astype(dtype)
  d_act = jnp.einsum("...d,fd->...f", d_out, w_down, preferred_element_type=jnp.float32)
  d_w_down = jnp.einsum("...f,...d->fd", act, d_out, preferred_element_type=jnp.float32)
  g, u = jnp.split(h.astype(jnp.float32), 2, axis=-1)
  s = jax.nn.sigmoid(g)
  d_h = jnp.concatenate([d_act * u * s * (1 + g * (1 - s)), d_act * g * s], axis=-1).astype(dtype)
  d_x = jnp.einsum("...f,df->...d", d_h, w_gate_up, preferred_element_type=jnp.float32)
  d_w_gate_up = jnp.einsum("...d,...f->df", x, d_h, preferred_element_type=jnp.float32)
  return d_x, d_w_gate_up, d_w_down


_swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)


class SwiGLU(nnx.Module):
  """``down(silu(x W_gate) * (x W_up))``, no biases; see :func:`swiglu` (float32 out)."""

  def __init__(self, d_model: int, hidden: int, *, std: float, out_std: float, param_dtype, dtype, rngs: nnx.Rngs):
    self.gate = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.up = param(rngs, (d_model, hidden), ("embed", "mlp"), std, param_dtype)
    self.down = param(rngs, (hidden, d_model), ("mlp", "embed"), out_std, param_dtype)
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    # One product for gate and up (a wider matmul runs nearer the CPU's peak than two narrow ones).
    f32 = lambda a: a.astype(jnp.float32)  # the backward returns float32 cotangents
    w = jnp.concatenate([self.gate[...], self.up[...]], axis=1)
    return swiglu(f32(x), f32(w), f32(self.down[...]), self.dtype)
