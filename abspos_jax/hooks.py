"""Named hook points, in the spirit of TransformerLens.

The model passes every interesting intermediate through ``hooks(name, value)``.
A :class:`Hooks` object can *edit* a value (an intervention: a pure function of
the value, traced into the same jitted forward) and/or *capture* it into
``hooks.cache``. With ``hooks=None`` the model runs its plain training path.

Point names (``l`` counts blocks from 0, ``L`` blocks in all):

- ``embed.tokens`` ``[B, T, D]``: token embeddings, before learned positions.
- ``resid.{l}`` ``[B, T, D]``: residual stream entering block ``l``;
  ``resid.0`` is the embedding output and ``resid.{L}`` the last block's output.
- ``blocks.{l}.attn.logits`` ``[B, H, T, T]``: ``s_ij = q_i . k_j / sqrt(d_h)``
  after RoPE, ``-inf`` on masked cells. Editing it (e.g. setting key 0 to
  ``-inf``) changes the softmax that follows.
- ``blocks.{l}.attn.log_z`` ``[B, H, T]``: ``log Z_i = logsumexp_j s_ij``.
- ``blocks.{l}.attn.weights`` ``[B, H, T, T]``: ``a_ij = exp(s_ij - log Z_i)``.
- ``blocks.{l}.attn.out`` and ``blocks.{l}.mlp.out`` ``[B, T, D]``: what each
  sublayer adds to the residual stream.
"""

from collections.abc import Callable, Collection, Mapping

import jax

Edit = Callable[[jax.Array], jax.Array]


class Hooks:
  """Edits and captures at named points during one (traced) forward pass."""

  def __init__(
      self,
      edits: Mapping[str, Edit] | None = None,
      capture: Collection[str] | Callable[[str], bool] = (),
  ):
    self.edits = dict(edits or {})
    self._capture = capture if callable(capture) else frozenset(capture).__contains__
    self.cache: dict[str, jax.Array] = {}

  def __call__(self, name: str, value: jax.Array) -> jax.Array:
    if name in self.edits:
      value = self.edits[name](value)
    if self._capture(name):
      self.cache[name] = value
    return value
