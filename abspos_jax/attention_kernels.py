"""Fused attention kernels for training, and the choice among them (``model.attention_impl``).

Every kernel computes :func:`abspos_jax.attention.softmax_attention`: causal
attention, optionally within a sliding window of ``W`` keys (query ``i`` sees
keys ``i - W + 1 .. i``), with grouped-query heads (query head ``n`` reads
key/value head ``n // G``). They differ in how the ``[B, H, T, T]`` weights
are formed: the fused kernels never write them to memory.

- ``xla``: the explicit path of :mod:`abspos_jax.attention` (masked softmax,
  hand-written backward). The analysis always runs it, since it reads the
  logits, weights and ``log Z`` through hook points.
- ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn",
  is_causal=True)``, cuDNN's flash attention on NVIDIA GPUs (compute
  capability 8.0 or newer, bfloat16 or float16 inputs, head_dim a multiple of
  8 up to 128). A window is ``local_window_size=(W - 1, 0)`` *together with*
  ``is_causal``: a window alone attends ``W - 1`` keys ahead as well.
- ``splash``: Pallas splash attention on TPU (``CausalMask``, or
  ``LocalMask`` for a window), ``T`` a multiple of 128.
- ``fused``: ``jax.nn.dot_product_attention`` with no implementation named,
  so JAX picks (cuDNN where it applies, else its XLA reference). Kept from
  before ``auto`` existed.
- ``auto``: ``cudnn`` or ``splash`` where it applies (see
  :func:`resolve`), ``xla`` elsewhere (the CPU).

The choice is made once per shape by :func:`resolve`, logged at the start of
training and recorded in ``metrics.jsonl`` (``attention_kernel``).
"""

import jax
import jax.numpy as jnp

IMPLS = ("xla", "cudnn", "splash", "fused", "auto")
HALF = ("bfloat16", "float16")
SPLASH_BLOCK = 128  # splash's default block: T must be a multiple of it


def _device_facts() -> tuple[str, float]:
  """``(platform, cuda compute capability or 0)`` of this process's first device."""
  device = jax.devices()[0]
  return device.platform, float(getattr(device, "compute_capability", 0) or 0)


def cudnn_problem(dtype: str, head_dim: int, platform: str, capability: float) -> str:
  """Why cuDNN's flash attention cannot run this shape here (``""`` when it can)."""
  if platform != "gpu":
    return f"it needs an NVIDIA GPU (jax backend 'gpu'); this process's backend is '{platform}'"
  if capability and capability < 8.0:
    return f"it needs compute capability 8.0 or newer; this GPU has {capability}"
  if str(jnp.dtype(dtype)) not in HALF:
    return f"it needs model.dtype bfloat16 (or float16); the config has {jnp.dtype(dtype)}"
  if head_dim % 8 or head_dim > 128:
    return f"it needs head_dim a multiple of 8 up to 128; the model has {head_dim}"
  return ""


def splash_problem(seq_len: int, platform: str) -> str:
  """Why splash attention cannot run this shape here (``""`` when it can)."""
  if platform != "tpu":
    return f"it needs a TPU (jax backend 'tpu'); this process's backend is '{platform}'"
  if seq_len % SPLASH_BLOCK:
    return f"it needs a sequence length that is a multiple of {SPLASH_BLOCK}; the model reads {seq_len}"
  return ""


def resolve(impl: str, *, dtype: str, head_dim: int, seq_len: int, platform: str | None = None,
            capability: float | None = None) -> str:
  """The kernel that ``impl`` runs for this shape on this machine: ``"xla"``, ``"cudnn"``, ``"splash"`` or
  ``"fused"``.

  ``auto`` is ``cudnn`` where :func:`cudnn_problem` finds nothing, else
  ``splash`` where :func:`splash_problem` finds nothing, else ``xla``. An
  explicit ``cudnn`` or ``splash`` that cannot run here raises ``ValueError``
  with the reason. ``platform`` and ``capability`` default to this process's
  first device.
  """
  if impl not in IMPLS:
    raise ValueError(f"model.attention_impl={impl!r}: must be one of {', '.join(IMPLS)}")
  if impl in ("xla", "fused"):  # run anywhere: no device to ask
    return impl
  if platform is None:
    platform, found = _device_facts()
    capability = found if capability is None else capability
  problems = {"cudnn": cudnn_problem(dtype, head_dim, platform, capability or 0.0),
              "splash": splash_problem(seq_len, platform)}
  if impl == "auto":
    return next((k for k, why in problems.items() if not why), "xla")
  if problems.get(impl):
    raise ValueError(f"model.attention_impl={impl!r} cannot run here: {problems[impl]}. "
                     f"Use 'auto' (the fused kernel where it applies, 'xla' elsewhere) or 'xla'.")
  return impl


def dot_product(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None, dtype,
                implementation: str | None) -> jax.Array:
  """``jax.nn.dot_product_attention`` on our layout: ``q [B, T, H, d_h]``, ``k, v [B, T, K, d_h]`` ->
  ``[B, T, H, d_h]`` float32, inputs cast to ``dtype``; ``implementation`` ``"cudnn"``, ``"xla"`` or None
  (JAX picks)."""
  local = None if window is None else (window - 1, 0)
  q, k, v = (x.astype(dtype) for x in (q, k, v))
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=local,
                                      implementation=implementation).astype(jnp.float32)


def splash(q: jax.Array, k: jax.Array, v: jax.Array, window: int | None, dtype,
           interpret: bool = False) -> jax.Array:
  """Splash attention on our layout (shapes as :func:`dot_product`); ``interpret`` runs the Pallas kernel
  in interpret mode (any backend, slow: for tests).

  One kernel per key/value head reads its ``G = H / K`` query heads (splash's
  multi-query form), mapped over the batch and the key/value heads. Splash
  applies no scale, so ``q`` is multiplied by ``1 / sqrt(d_h)`` first.
  """
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

  b, t, h, d = q.shape
  kv = k.shape[2]
  shape = (t, t)
  one = mask_lib.CausalMask(shape) if window is None else mask_lib.LocalMask(shape, (window - 1, 0), 0)
  kernel = kernel_lib.make_splash_mqa_single_device(mask=mask_lib.MultiHeadMask([one] * (h // kv)),
                                                    interpret=interpret)
  qg = (q * d ** -0.5).astype(dtype).reshape(b, t, kv, h // kv, d).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, d]
  kg, vg = (x.astype(dtype).transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, T, d]
  out = jax.vmap(jax.vmap(kernel))(qg, kg, vg)  # [B, K, G, T, d]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(jnp.float32)


def run(kernel: str, q: jax.Array, k: jax.Array, v: jax.Array, window: int | None, dtype) -> jax.Array:
  """A fused ``kernel`` of :func:`resolve` (not ``"xla"``) on our layout (shapes as :func:`dot_product`)."""
  if kernel == "splash":
    return splash(q, k, v, window, dtype)
  return dot_product(q, k, v, window, dtype, "cudnn" if kernel == "cudnn" else None)
