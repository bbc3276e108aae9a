"""Inference-time variants of a trained model: NTK-aware RoPE scaling and a sliding window on the same weights.

Practitioners extend a model's context by raising its RoPE base (NTK-aware
scaling, ``b -> b * alpha ** (d_h / (d_h - 2))``) and stream with a window of
``W`` keys, both without retraining. Applied to a checkpoint at analysis time
(``analyze.py --rope_scale=ntk:ALPHA``, ``--window=W``), they let the paper's
NTK and SWA claims be probed on a pretrained LM. They are *not* the models the
paper compares, which are trained from scratch with the scheme
(``configs/ntk.py``, ``configs/swa.py``): the weights here were trained
without it, so the held-out loss of the variant is reported beside the
unmodified model's.
"""

from __future__ import annotations

import dataclasses

import ml_collections
from flax import nnx

from abspos_jax import config as config_lib
from abspos_jax import model as model_lib


@dataclasses.dataclass(frozen=True)
class Variant:
  """``ntk_alpha``: NTK-aware scaling of the RoPE base (None: unchanged); ``window``: keys each query sees,
  itself included (None: unchanged)."""

  ntk_alpha: float | None = None
  window: int | None = None

  def __bool__(self) -> bool:
    return self.ntk_alpha is not None or self.window is not None

  def context_scale(self) -> float:
    """How many times the trained context the variant is meant to reach: NTK-aware scaling by ``alpha`` is the
    usual ``alpha``-times context extension; a window or no variant, 1."""
    return self.ntk_alpha or 1.0

  def describe(self) -> dict:
    return {"rope_scale": None if self.ntk_alpha is None else f"ntk:{self.ntk_alpha:g}", "window": self.window,
            "kind": "inference-time variant of the checkpoint's weights, not a model trained this way"}


def parse_rope_scale(text: str | None) -> float | None:
  """``"ntk:ALPHA"`` -> ALPHA (> 0); None or "" -> None. Other scalings are refused by name."""
  if not text:
    return None
  kind, _, value = text.partition(":")
  if kind != "ntk":
    raise ValueError(f"--rope_scale={text!r}: only ntk:ALPHA is implemented (NTK-aware base "
                     "rope_base * ALPHA ** (d_h / (d_h - 2))); linear interpolation and YaRN are not")
  try:
    alpha = float(value)
  except ValueError:
    raise ValueError(f"--rope_scale={text!r}: ALPHA must be a number, e.g. ntk:4") from None
  if not alpha > 0:
    raise ValueError(f"--rope_scale={text!r}: ALPHA must be > 0")
  return alpha


def apply(config: ml_collections.ConfigDict, variant: Variant) -> ml_collections.ConfigDict:
  """A copy of ``config`` whose model has the variant's RoPE base and window, validated.

  ``ntk_alpha`` turns a ``rope`` model into ``ntk`` (an ``ntk`` model's alpha is
  multiplied: the bases compose). ``window`` turns a ``rope`` model into ``swa``
  on every layer, or replaces a ``swa`` model's window (its layer pattern kept).
  The two do not combine (a model has one position scheme), and neither
  applies to ``nope`` or ``learned`` models.
  """
  c = ml_collections.ConfigDict(config.to_dict())
  m = c.model
  if variant.ntk_alpha is not None and variant.window is not None:
    raise ValueError("--rope_scale and --window do not combine: the model has one position scheme "
                     "(ntk or swa); analyse each variant on its own")
  if variant.ntk_alpha is not None:
    if m.position not in ("rope", "ntk"):
      raise ValueError(f"--rope_scale applies to RoPE models without a window; this one is {m.position!r}")
    m.ntk_alpha = variant.ntk_alpha * (m.ntk_alpha if m.position == "ntk" else 1.0)
    m.position = "ntk"
  if variant.window is not None:
    if m.position not in ("rope", "swa"):
      raise ValueError(f"--window applies to RoPE models (rope, or swa to change the window); this one is "
                       f"{m.position!r}")
    if variant.window < 1:
      raise ValueError(f"--window must be >= 1, got {variant.window}")
    if m.position == "rope":
      m.layer_pattern = ""
    m.position, m.window = "swa", variant.window
  try:
    config_lib.validate(c, num_devices=1)
  except config_lib.ConfigError as e:
    raise ValueError(f"the variant {variant.describe()} gives an invalid config: {e}") from e
  return c


def rebuild(model: model_lib.Decoder, config: ml_collections.ConfigDict) -> model_lib.Decoder:
  """``model``'s parameters in the model of ``config`` (a variant: same parameter shapes)."""
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: model_lib.create(config)), nnx.Param)
  _, params = nnx.split(model, nnx.Param)
  return nnx.merge(graphdef, params)
