"""Named hook points, in the spirit of TransformerLens.

The model passes every interesting intermediate through ``hooks(name, value)``.
A :class:`Hooks` object can *edit* a value (an intervention: a pure function of
the value, traced into the same jitted forward) and/or *capture* it into
``hooks.cache``. With ``hooks=None`` the model runs its plain training path.

Point names (``l`` counts blocks from 0, ``L`` blocks in all), built with the
constructors of this module (:func:`resid`, :func:`attn`, :func:`mlp_out`;
:func:`layer_of` reads the index back), never spelled by hand elsewhere:

- ``embed.tokens`` ``[B, T, D]``: token embeddings, before learned positions.
- ``resid.{l}`` ``[B, T, D]``: residual stream entering block ``l``;
  ``resid.0`` is the embedding output and ``resid.{L}`` the last block's output.
- ``blocks.{l}.attn.logits`` ``[B, H, T, T]``: ``s_ij = q_i . k_j / sqrt(d_h)``
  after RoPE, ``-inf`` on masked cells. Editing it (e.g. setting key 0 to
  ``-inf``) changes the softmax that follows.
- ``blocks.{l}.attn.weights`` ``[B, H, T, T]``: ``a_ij = exp(s_ij - log Z_i)``.
- ``blocks.{l}.attn.log_z`` ``[B, H, T]``: ``log Z_i = logsumexp_j s_ij``, reached
  once the layer's weights are computed (capturing or editing it changes no weight).
- ``blocks.{l}.attn.out`` and ``blocks.{l}.mlp.out`` ``[B, T, D]``: what each
  sublayer adds to the residual stream.
"""

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import jax

Edit = Callable[[jax.Array], jax.Array]

EMBED_TOKENS = "embed.tokens"
ATTENTION = ("logits", "log_z", "weights", "out")  # the points of a block's attention
_RESID, _BLOCK = "resid", "blocks"


def resid(l: int) -> str:
  """The residual stream entering block ``l`` (``resid(0)``: the embedding output; ``resid(L)``: the last
  block's output)."""
  return f"{_RESID}.{l}"


def attn(l: int, what: str) -> str:
  """A point of block ``l``'s attention: ``what`` is one of :data:`ATTENTION`."""
  if what not in ATTENTION:
    raise ValueError(f"attention hook point {what!r} does not exist; it is one of {', '.join(ATTENTION)}")
  return f"{_BLOCK}.{l}.attn.{what}"


def mlp_out(l: int) -> str:
  """What block ``l``'s MLP adds to the residual stream."""
  return f"{_BLOCK}.{l}.mlp.out"


def layer_of(name: str) -> int | None:
  """The index in a point's name: ``l`` of ``resid(l)``, ``attn(l, .)`` and ``mlp_out(l)``; None for
  :data:`EMBED_TOKENS`."""
  parts = name.split(".")
  return int(parts[1]) if parts[0] in (_RESID, _BLOCK) and len(parts) > 1 and parts[1].isdigit() else None


def is_attn(name: str, what: str) -> bool:
  """Whether ``name`` is ``attn(l, what)`` for some ``l``."""
  return name.startswith(f"{_BLOCK}.") and name.endswith(f".attn.{what}")


def is_resid(name: str) -> bool:
  return name.startswith(f"{_RESID}.")


def points(num_layers: int) -> list[str]:
  """Every point of a model with ``num_layers`` blocks, in the order a forward pass reaches them."""
  out = [EMBED_TOKENS, resid(0)]
  for l in range(num_layers):
    out += [attn(l, "logits"), attn(l, "weights"), attn(l, "log_z"), attn(l, "out"), mlp_out(l), resid(l + 1)]
  return out


def check(names: Iterable[str], num_layers: int) -> None:
  """Raise ``ValueError`` naming every point of ``names`` a ``num_layers``-block model does not have, with the
  valid ones (a misspelt edit would otherwise silently do nothing)."""
  unknown = sorted(set(names) - set(points(num_layers)))
  if unknown:
    L = num_layers
    raise ValueError(f"unknown hook point(s) {', '.join(map(repr, unknown))}; a {L}-block model has "
                     f"{EMBED_TOKENS}, {resid(0)} .. {resid(L)}, blocks.{{0..{L - 1}}}.attn.{{{','.join(ATTENTION)}}} "
                     f"and blocks.{{0..{L - 1}}}.mlp.out (abspos_jax.hooks.resid, attn, mlp_out)")


class Hooks:
  """Edits and captures at named points during one (traced) forward pass.

  ``edits`` and a collection ``capture`` are checked against the model's points
  when the forward starts (:meth:`check`): an unknown name raises.
  ``query_block``: the attention runs that many queries at a time
  (``attention.query_block_attention``; it must divide ``T``), so that no
  layer's ``[B, H, T, T]`` logits are alive at once; None (or capturing a
  layer's logits or weights, which are then whole) runs all ``T`` at once.
  The logits and weights edits then see ``[B, H, R, W]`` blocks of rows over
  the keys ``0 .. W - 1`` that the block's queries can see (``attention.key_bands``);
  a windowed layer that no edit touches scores only the keys of its window
  (``attention.window_span``).
  A layer whose attention nothing reads or edits (:meth:`reads_attention`)
  runs the model's plain explicit path, as without hooks.
  """

  def __init__(
      self,
      edits: Mapping[str, Edit] | None = None,
      capture: Collection[str] | Callable[[str], bool] = (),
      query_block: int | None = None,
  ):
    self.edits = dict(edits or {})
    self._names = set(self.edits) | (set() if callable(capture) else set(capture))
    self._capture = capture if callable(capture) else frozenset(capture).__contains__
    self._any_point = callable(capture)
    self.query_block = query_block
    # A callable capture may ask for any point: then every layer's logits and weights stay whole.
    self._whole_logits = self._any_point or any(is_attn(n, w) for n in capture for w in ("logits", "weights"))
    self.cache: dict[str, jax.Array] = {}

  def check(self, num_layers: int) -> None:
    check(self._names, num_layers)

  def reads_attention(self, layer: int) -> bool:
    """Whether anything captures or edits layer ``layer``'s logits, weights or ``log Z`` (or folds its blocks:
    subclasses with a :meth:`attention_fold` say so).

    When nothing does and its attention runs whole, the layer may take the
    plain path (``attention.softmax_attention``: its causal blocks skip keys no
    query of the block sees), which computes the same output.
    """
    attention = [attn(layer, w) for w in ("logits", "weights", "log_z")]
    return self._any_point or any(n in self._names for n in attention)

  def edits_attention(self, layer: int) -> bool:
    """Whether an edit changes layer ``layer``'s logits or weights (it then sees its blocks' keys from key 0)."""
    return any(attn(layer, w) in self.edits for w in ("logits", "weights"))

  def query_block_size(self, seq_len: int) -> int:
    """The queries per attention block for ``seq_len`` tokens (``seq_len`` itself when not blocked)."""
    whole = self._whole_logits
    if self.query_block is None or self.query_block >= seq_len or whole:
      return seq_len
    if seq_len % self.query_block:
      raise ValueError(f"query_block={self.query_block} must divide the sequence length {seq_len}")
    return self.query_block

  def attention_fold(self, layer: int) -> tuple[Any, Any]:
    """``(fold, state)`` for layer ``layer``'s query blocks (``attention.BlockFold``, which receives each
    block's query and key starts); ``(None, None)``: no fold."""
    return None, None

  def attention_folded(self, layer: int, state: Any) -> None:
    """Receives the ``state`` the fold of :meth:`attention_fold` left after the layer's last block."""

  def __call__(self, name: str, value: jax.Array) -> jax.Array:
    if name in self.edits:
      value = self.edits[name](value)
    if self._capture(name):
      self.cache[name] = value
    return value
