"""Mixed precision: matmuls with low-precision inputs and float32 accumulation, forward and backward.

``model.dtype`` is the dtype of matmul *inputs*; every product accumulates and
returns float32, and everything between matmuls (the residual stream, norms,
RoPE, softmax and its ``log Z``, the loss) stays float32. Two facts of XLA
make this the fast form, not just the accurate one:

- a ``bf16 x bf16 -> bf16`` dot is rewritten on CPU into
  ``convert -> f32 dot -> convert``, slower than float32 itself, while
  ``bf16 x bf16 -> f32`` (``preferred_element_type=float32``) runs the native
  bf16 kernels at about twice the float32 rate (``docs/benchmarks.md``);
- autodiff of a dot with a float32 output produces float32 cotangents, so
  both backward products would see a float32 operand and fall back to float32.

:func:`einsum` therefore carries its own backward, which casts the float32
cotangent to the input dtype before the two transposed products; in float32
it is plain ``jnp.einsum``. The attention and the SwiGLU MLP, whose backward
passes are written by hand (:func:`abspos_jax.attention.softmax_attention`,
:func:`abspos_jax.layers.swiglu`), follow the same rule and also keep what
their backward reads (q, k, v, the attention weights; the MLP's ``[g, u]``)
in the input dtype: computed in float32, stored rounded. The forward values
the analysis reads (logits, weights, ``log Z``, the residual stream) are
float32 either way.
"""

import functools

import jax
import jax.numpy as jnp


def _parse(eq: str) -> tuple[str, str, str]:
  inputs, out = eq.replace(" ", "").split("->")
  x, w = inputs.split(",")
  for name, sub, other in (("first", x, w), ("second", w, x)):
    if any(c not in other and c not in out for c in sub):
      raise ValueError(f"einsum {eq!r}: an index of the {name} operand is summed without being shared; "
                       "the transposed products need every input index in the other input or the output")
  return x, w, out


def einsum(eq: str, x: jax.Array, w: jax.Array, dtype=jnp.float32) -> jax.Array:
  """``jnp.einsum(eq, x, w)`` with both operands cast to ``dtype``, accumulated and returned in float32.

  ``eq`` names two operands (``"btd,dhk->bthk"``); every index of one operand
  appears in the other or in the output. Gradients come back in the dtypes of
  ``x`` and ``w``; for a low-precision ``dtype`` the backward products also
  take ``dtype`` inputs (see the module docstring).
  """
  if jnp.dtype(dtype) == jnp.float32:
    return jnp.einsum(eq, x.astype(jnp.float32), w.astype(jnp.float32))
  return _low_precision_einsum(eq, jnp.dtype(dtype), x.dtype, w.dtype, x, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _low_precision_einsum(eq, dtype, x_dtype, w_dtype, x, w):
  return jnp.einsum(eq, x.astype(dtype), w.astype(dtype), preferred_element_type=jnp.float32)


def _fwd(eq, dtype, x_dtype, w_dtype, x, w):
  xc, wc = x.astype(dtype), w.astype(dtype)
  # The cast operands are the residuals: half the bytes, and the backward needs them in ``dtype`` anyway.
  return jnp.einsum(eq, xc, wc, preferred_element_type=jnp.float32), (xc, wc)


def _bwd(eq, dtype, x_dtype, w_dtype, residuals, g):
  xc, wc = residuals
  xs, ws, out = _parse(eq)
  g = g.astype(dtype)
  dx = jnp.einsum(f"{out},{ws}->{xs}", g, wc, preferred_element_type=jnp.float32)
  dw = jnp.einsum(f"{xs},{out}->{ws}", xc, g, preferred_element_type=jnp.float32)
  return dx.astype(x_dtype), dw.astype(w_dtype)


_low_precision_einsum.defvjp(_fwd, _bwd)
