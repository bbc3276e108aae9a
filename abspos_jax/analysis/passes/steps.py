"""The jitted analysis pass: one forward per batch, reduced to sufficient statistics.

``make_baseline_step``, ``make_core_step`` and ``make_intervention_step``
build pure functions of ``(params, acc, tokens, seq_ids, ...) -> acc`` that run
the model once through :class:`abspos_jax.hooks.Hooks` (the same attention
code path as training) and fold the captures into the estimator accumulators
of this package. The core step (denominators, leakage, position 0) is the part
of the baseline step that the training-time emergence hook runs. Each layer's
attention runs ``query_block`` queries at a time and each block's logits are
folded into the accumulators as soon as they are computed (:func:`fold_pass`),
so the pass holds ``[B, H, query_block, T]`` logits, never a layer's
``[B, H, T, T]`` (with ``query_block = None``: one layer's at a time, never
``[B, L, H, T, T]``); accumulators are ``O(L * H * T)`` whatever the number of
sequences.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax.analysis.estimators import denominators, leakage, position0, probes

from abspos_jax.analysis.passes import accumulators
from abspos_jax.analysis.estimators.fixed_effects import FEDesign
from abspos_jax import hooks as hooks_lib
from abspos_jax.hooks import Edit, Hooks
from abspos_jax.model import Decoder
from abspos_jax.loss import chunked_lm_loss

# Attention features the attention-pattern probe reads, per head.
ATTENTION_FEATURES = ("log_z", "entropy", "sink_mass", "max_weight")
# Tokens of logits the loss makes at a time: [B, 512, V] is 100 MB per sequence for a 49,152-token vocabulary,
# where a whole [B, T, V] at 16,384 tokens is 3.2 GB.
LOSS_CHUNK = 512


@dataclasses.dataclass(frozen=True)
class Statistic:
  """A user statistic at named hook points, accumulated by the same pass.

  ``update(acc, captures)`` receives a dict with the requested ``points`` (see
  :mod:`abspos_jax.hooks`) plus ``tokens [B, T]`` and ``seq_ids [B]``; it must
  be jittable and built from sums so batches accumulate. ``finalize(acc)``
  returns a dict of arrays.
  """

  points: tuple[str, ...]
  init: Callable[[], Any]
  update: Callable[[Any, dict[str, jax.Array]], Any]
  finalize: Callable[[Any], dict[str, jax.Array]]


def core_points(num_layers: int) -> list[str]:
  """The points every analysis forward captures: the residual streams (the attention statistics are folded
  as each layer runs, :func:`fold_pass`)."""
  return [hooks_lib.resid(l) for l in range(num_layers + 1)]


class _FoldingHooks(Hooks):
  """Hooks that fold each layer's attention, block by block of queries, into the leakage and denominator
  accumulators while the layer runs (:class:`leakage.LayerFold`).

  ``state`` holds ``leakage`` and ``denominators`` accumulators and the
  per-layer ``zres`` and ``qstats`` so far. The block's output then passes an
  optimisation barrier together with the state, so layer ``l + 1`` starts
  only after layer ``l`` is folded: XLA cannot defer the folds to the end
  and keep every layer's logits alive.
  """

  def __init__(self, edits, capture, query_block, design: FEDesign, seq_ids: jax.Array, state: dict):
    super().__init__(edits, capture, query_block)
    self.design, self.seq_ids, self.state, self._fold = design, seq_ids, state, None

  def reads_attention(self, layer: int) -> bool:
    return True

  def attention_fold(self, layer: int):
    self._fold = leakage.LayerFold(self.design, layer, self.seq_ids)
    return self._fold, self.state["leakage"]

  def attention_folded(self, layer: int, state: dict) -> None:
    lk, zres, q = self._fold.end(self.state["leakage"], state)
    s = self.state
    self.state = {"leakage": lk, "denominators": denominators.accumulate_layer(s["denominators"], layer, q,
                                                                              self.seq_ids),
                  "zres": (*s["zres"], zres), "qstats": (*s["qstats"], q)}

  def __call__(self, name: str, value: jax.Array) -> jax.Array:
    value = super().__call__(name, value)
    if hooks_lib.is_resid(name) and name != hooks_lib.resid(0):
      value, self.state = jax.lax.optimization_barrier((value, self.state))
    return value


def forward(model: Decoder, tokens: jax.Array, edits: Mapping[str, Edit] | None = None,
            extra_points: tuple[str, ...] = (), query_block: int | None = None) -> dict[str, jax.Array]:
  """Run ``model`` on ``tokens [B, T]`` through :class:`Hooks` (``query_block`` queries of attention at a time).

  Returns ``resid [B, L+1, T, D]`` (float32), ``features [B, T, D]`` (what the head reads:
  ``Decoder.features``; the loss makes the logits from it in chunks) and
  every point of ``extra_points`` under its own name. Where no edit or
  capture reads a layer's attention and ``query_block`` leaves it whole, the
  layer runs the plain explicit path (``Hooks.reads_attention``).
  """
  return _captures(model, tokens, Hooks(edits, _capture(model, extra_points), query_block), extra_points)


def _capture(model: Decoder, extra_points: tuple[str, ...]) -> set[str]:
  return set(core_points(model.spec.num_layers)) | set(extra_points)


def _captures(model: Decoder, tokens: jax.Array, hooks: Hooks, extra_points: tuple[str, ...]) -> dict:
  n = model.spec.num_layers
  features = model.features(tokens, hooks=hooks)
  c = hooks.cache
  return {"features": features,
          "resid": jnp.stack([c[hooks_lib.resid(l)] for l in range(n + 1)], 1).astype(jnp.float32),
          **{p: c[p] for p in extra_points}}


def fold_pass(model: Decoder, acc: dict, tokens: jax.Array, seq_ids: jax.Array, design: FEDesign,
              edits: Mapping[str, Edit] | None = None, extra_points: tuple[str, ...] = (),
              query_block: int | None = None
              ) -> tuple[dict, dict[str, jax.Array], jax.Array, dict[str, jax.Array]]:
  """One forward with the leakage and denominator statistics folded in, layer by layer and block by block.

  ``acc`` holds ``leakage`` and ``denominators`` accumulators (other keys are
  passed through); the statistics are measured on ``design``'s cells and keys
  (:class:`leakage.LayerFold`). The attention runs ``query_block`` queries
  at a time (None: all at once), so the pass holds ``[B, H, query_block, T]``
  logits, never a layer's ``[B, H, T, T]``. Returns ``(acc, captures, zres,
  qstats)``: captures as :func:`forward`, ``zres [B, L, H, T]`` the residual
  part of ``log Z`` and ``qstats`` the denominator statistics (each ``[B, L,
  H, T]``), both from the leakage's one pass over each layer's logits.
  """
  start = {"leakage": acc["leakage"], "denominators": acc["denominators"], "zres": (), "qstats": ()}
  hooks = _FoldingHooks(edits, _capture(model, extra_points), query_block, design, seq_ids, start)
  cap = _captures(model, tokens, hooks, extra_points)
  state = hooks.state
  qstats = {k: jnp.stack([q[k] for q in state["qstats"]], 1) for k in state["qstats"][0]}
  out = {**acc, "leakage": accumulators.count(state["leakage"], seq_ids),
         "denominators": accumulators.count(state["denominators"], seq_ids)}
  return out, cap, jnp.stack(state["zres"], 1), qstats


def attention_features(stats: dict[str, jax.Array]) -> jax.Array:
  """Per layer and query, :data:`ATTENTION_FEATURES` of every head: ``[B, L, T, 4 H]``.

  ``stats`` is ``denominators.query_statistics(...)`` (each ``[B, L, H, T]``).
  These raw features include the mask's effect (``log Z`` and entropy equal
  ``log(1+i)`` under flat attention); the headline attention probe reads the
  residual part of ``log Z`` instead (:func:`update_core`).
  """
  f = jnp.stack([stats[name] for name in ATTENTION_FEATURES], -1)  # [B, L, H, T, 4]
  b, l, h, t, k = f.shape
  return f.transpose(0, 1, 3, 2, 4).reshape(b, l, t, h * k)


def init_core(spec, seq_len: int, num_blocks: int, num_groups: int | None = None) -> dict:
  """Zero accumulators of the core statistics: ``denominators``, ``leakage`` and ``position0``.

  ``num_blocks``: sequence blocks (``seq_id % num_blocks``) of the intervals;
  ``num_groups``: how many distinct first tokens the fingerprint groups by
  (see ``x0_groups`` of :func:`update_core`); default ``vocab_size``.
  """
  L, H, D = spec.num_layers, spec.num_heads, spec.d_model
  return {"denominators": denominators.init(L, H, seq_len, num_blocks),
          "leakage": leakage.init(L, H, seq_len, num_blocks),
          "position0": position0.init(L, D, spec.vocab_size if num_groups is None else num_groups)}


def update_core(model: Decoder, acc: dict, tokens: jax.Array, seq_ids: jax.Array, design: FEDesign,
                x0_groups: jax.Array | None = None, extra_points: tuple[str, ...] = (),
                query_block: int | None = None
                ) -> tuple[dict, dict[str, jax.Array], jax.Array, dict[str, jax.Array]]:
  """One forward of ``model`` on ``tokens [B, T]`` folded into the core accumulators of :func:`init_core`.

  Other keys of ``acc`` pass through. ``seq_ids [B]`` pick the blocks,
  ``design`` is ``fixed_effects.make_design`` of the model's mask.
  ``x0_groups [V]`` int maps a first token to its fingerprint group (a dense
  index over the first tokens that occur), so the per-group accumulator is
  ``[groups, L+1, D]`` rather than ``[V, L+1, D]`` (gigabytes for a 32k-150k
  vocabulary); None groups by the token id itself. Returns ``(acc, captures,
  zres, qstats)`` as :func:`fold_pass` (``query_block`` as there).
  """
  acc, cap, zres, qstats = fold_pass(model, acc, tokens, seq_ids, design, extra_points=extra_points,
                                     query_block=query_block)
  groups = tokens if x0_groups is None else x0_groups[tokens[:, :1]]
  return {**acc, "position0": position0.update(acc["position0"], cap["resid"], groups)}, cap, zres, qstats


def make_core_step(graphdef: nnx.GraphDef, design: FEDesign,
                   x0_groups: jax.Array | None = None, query_block: int | None = None):
  """``step(params, acc, tokens [B, T], seq_ids [B]) -> acc``: one forward, only the core statistics.

  What the training-time emergence hook (``analysis/emergence.py``) runs:
  the baseline step without the closedness forward, the probes and the loss.
  """
  def step(params, acc, tokens, seq_ids):
    return update_core(nnx.merge(graphdef, params), acc, tokens, seq_ids, design, x0_groups,
                       query_block=query_block)[0]

  return step


def init_accumulators(spec, seq_len: int, user: Mapping[str, Statistic], num_blocks: int,
                      num_groups: int | None = None) -> dict:
  """Zero accumulators for a baseline pass over sequences of ``seq_len`` tokens.

  The core ones of :func:`init_core` (``num_blocks``, ``num_groups`` as there)
  plus probes, closedness, loss and the user statistics.
  """
  L, H, D = spec.num_layers, spec.num_heads, spec.d_model
  return {**init_core(spec, seq_len, num_blocks, num_groups), **_init_checks(L),
          "probe_resid": probes.init(L + 1, D, num_blocks),
          "probe_attn": probes.init(L, H, num_blocks),
          "probe_attn_raw": probes.init(L, len(ATTENTION_FEATURES) * H, num_blocks),
          "user": {name: stat.init() for name, stat in user.items()}}


def _init_checks(num_layers: int) -> dict:
  """Zero accumulators of :func:`_checks`: ``closedness [L+1]`` and the loss sums."""
  return {"closedness": jnp.zeros((num_layers + 1,), jnp.float32),
          "loss_sum": jnp.zeros((), jnp.float32), "loss_count": jnp.zeros((), jnp.float32)}


def init_position0_pass(spec, num_groups: int | None = None) -> dict:
  """Zero accumulators of :func:`make_position0_step`: ``position0`` (``num_groups`` as in :func:`init_core`),
  ``closedness`` and the loss sums."""
  groups = spec.vocab_size if num_groups is None else num_groups
  return {"position0": position0.init(spec.num_layers, spec.d_model, groups), **_init_checks(spec.num_layers)}


def closedness_inputs(tokens: jax.Array, k: int, vocab_size: int) -> jax.Array:
  """``[k, T]``: the first ``k`` sequences with every token after position 0 changed.

  Each takes the previous sequence's tokens of the batch (the last one's for
  the first) and, where a token would stay the same (always so for a batch of
  one sequence), the next token id instead, so that every later token differs.
  """
  rolled = jnp.roll(tokens, 1, axis=0)[:k, 1:]
  own = tokens[:k, 1:]
  later = jnp.where(rolled == own, (own + 1) % vocab_size, rolled)
  return jnp.concatenate([tokens[:k, :1], later], axis=1)


def _checks(model: Decoder, acc: dict, cap: dict[str, jax.Array], tokens: jax.Array, seq_ids: jax.Array,
            closedness_sequences: int, query_block: int | None, same_path: bool) -> dict:
  """The closedness check and the loss sums of a batch, given its forward's captures ``cap`` (``same_path``:
  taken on :func:`forward`'s path, so that they may be one side of the check).

  The check runs on the sweep's first batch (the one holding sequence 0; the
  others skip it under a ``lax.cond``): it takes that batch's first ``k =
  min(closedness_sequences, B)`` sequences, runs them as they are and with
  every token after position 0 changed (:func:`closedness_inputs`), and keeps
  the largest change of ``h_0`` per layer; with ``k = B`` the batch's own
  forward is the first of the two. A causal leak moves ``h_0`` on any
  sequence, so a few sequences make the check, and its cost is at most two
  forwards of one batch per sweep (one where the batch's forward is reused),
  whatever the number of batches: at 8,192 tokens a batch holds one
  sequence, and checking 4 would cost 4 forwards per policy. Its
  forwards run ``query_block`` queries of attention at a time (whole: the
  plain path, which the folding pass does not take).
  """
  # Same x_0, different tokens after it: position 0 must not move. Both sides come from forwards of
  # the same shape: a causal model then gives bitwise-equal h_0, whereas a [k, T] and a [B, T]
  # forward may round differently (~1e-5).
  k = min(closedness_sequences, tokens.shape[0])

  def check() -> jax.Array:
    other = closedness_inputs(tokens, k, model.spec.vocab_size)
    reuse = k == tokens.shape[0] and same_path
    same = cap["resid"] if reuse else forward(model, tokens[:k], query_block=query_block)["resid"]
    return position0.closedness_max_abs_diff(same, forward(model, other, query_block=query_block)["resid"])

  closedness = jax.lax.cond(seq_ids[0] == 0, check, lambda: jnp.zeros_like(acc["closedness"]))
  n = tokens.shape[0] * (tokens.shape[1] - 1)
  return {"closedness": jnp.maximum(acc["closedness"], closedness),
          "loss_sum": acc["loss_sum"] + chunked_lm_loss(model.logits, cap["features"][:, :-1], tokens[:, 1:],
                                                        LOSS_CHUNK) * n,
          "loss_count": acc["loss_count"] + n}


def _check_closedness_sequences(closedness_sequences: int) -> None:
  if closedness_sequences < 1:
    raise ValueError(f"closedness_sequences (AnalysisOptions.closedness_sequences) must be >= 1, "
                     f"got {closedness_sequences}")


def make_baseline_step(graphdef: nnx.GraphDef, design: FEDesign,
                       user: Mapping[str, Statistic], x0_groups: jax.Array | None = None,
                       closedness_sequences: int = 4, query_block: int | None = None):
  """``step(params, acc, tokens [B, T], seq_ids [B]) -> acc`` for the unmodified model.

  The core statistics (:func:`update_core`, ``design`` and ``x0_groups`` as
  there), the closedness check and the loss (:func:`_checks`, on the batches
  holding the first ``closedness_sequences`` sequences), the probes and the
  user statistics; the attention runs ``query_block`` queries at a time
  (:func:`fold_pass`).
  """
  _check_closedness_sequences(closedness_sequences)
  extra = tuple(sorted({p for stat in user.values() for p in stat.points}))

  def step(params, acc, tokens, seq_ids):
    model = nnx.merge(graphdef, params)
    core, cap, zres, qstats = update_core(model, acc, tokens, seq_ids, design, x0_groups, extra, query_block)
    out = {
        **core,
        "probe_resid": probes.update(acc["probe_resid"], probes.rms_normalize(cap["resid"]), seq_ids),
        "probe_attn": probes.update(acc["probe_attn"], jnp.swapaxes(zres, 2, 3), seq_ids),
        "probe_attn_raw": probes.update(acc["probe_attn_raw"], attention_features(qstats), seq_ids),
        # Blocked, the folding pass and forward() run the same attention; whole, forward() takes the plain path.
        **_checks(model, acc, cap, tokens, seq_ids, closedness_sequences, query_block,
                  same_path=query_block is not None and query_block < tokens.shape[1]),
    }
    captures = {**{p: cap[p] for p in extra}, "tokens": tokens, "seq_ids": seq_ids}
    out["user"] = {name: stat.update(acc["user"][name], captures) for name, stat in user.items()}
    return out

  return step


def make_position0_step(graphdef: nnx.GraphDef, x0_groups: jax.Array | None = None,
                        closedness_sequences: int = 4, query_block: int | None = None):
  """``step(params, acc, tokens [B, T], seq_ids [B]) -> acc``: position 0, the closedness check and the loss.

  What the analysis reads from the BOS policy that is not the main one (its
  fingerprint of ``x_0``, its loss, its closedness): one plain forward per
  batch, no attention statistics (``acc`` from :func:`init_position0_pass`;
  ``x0_groups`` and ``query_block`` as in :func:`update_core`).
  """
  _check_closedness_sequences(closedness_sequences)

  def step(params, acc, tokens, seq_ids):
    model = nnx.merge(graphdef, params)
    cap = forward(model, tokens, query_block=query_block)
    groups = tokens if x0_groups is None else x0_groups[tokens[:, :1]]
    return {"position0": position0.update(acc["position0"], cap["resid"], groups),
            **_checks(model, acc, cap, tokens, seq_ids, closedness_sequences, query_block, same_path=True)}

  return step


def make_intervention_step(graphdef: nnx.GraphDef, edits_fn, query_block: int | None = None):
  """``step(params, acc, tokens, seq_ids, source, design, operand) -> acc`` accumulating leakage and denominators.

  ``edits_fn(model, tokens, source, operand)`` builds the edits inside the
  trace (it may run the model on ``source`` first, as ``pos0_patch`` does).
  Both are measured on ``design`` (an input, like ``operand``: one program
  serves every intervention of one ``edits_fn``): leakage on its cells (per
  head for ``sink_ablate``, see ``edits.sink_cells``), the denominator
  statistics over its keys, from the same pass over the logits (for
  ``sink_ablate`` the keys each head's softmax sees, so ``excess`` counts
  ``i`` keys in an ablated head). ``query_block`` as in :func:`fold_pass`;
  ``edits_fn`` gets it as a keyword for its own forwards.
  """
  def step(params, acc, tokens, seq_ids, source, design, operand):
    model = nnx.merge(graphdef, params)
    edits = edits_fn(model, tokens, source, operand, query_block=query_block)
    return fold_pass(model, acc, tokens, seq_ids, design, edits=edits, query_block=query_block)[0]

  return step


class CompiledStep:
  """``fn(params, acc, tokens [B, T], seq_ids [B], *args) -> acc`` jitted with ``acc`` donated, compiled once per
  shape of its inputs and run on one device.

  Every input is committed to ``device`` (:meth:`put`), so a sweep's first
  call, whose accumulators come from an init function, runs the same program
  as the later ones, which get the step's own output; and the programs that
  the memory budget compiles to measure a batch size (:meth:`compiled` on
  shapes) are the ones the sweep then calls. ``args`` (batched like the tokens,
  or not: a design, an intervention's operands) are traced inputs, so steps
  that differ only in their values share one program.
  """

  def __init__(self, fn: Callable, device: jax.Device | None = None):
    self.device = device or jax.local_devices()[0]
    self._jit = jax.jit(fn, donate_argnums=1)
    self._programs: dict = {}

  def put(self, tree: Any) -> Any:
    """``tree``'s arrays committed to the step's device (no copy where they already are there)."""
    return jax.device_put(tree, self.device)

  def compiled(self, *inputs: Any):
    """The compiled program for ``inputs`` (arrays or ``ShapeDtypeStruct`` s): compiled on first use."""
    avals = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=getattr(x, "weak_type", False),
                                                        sharding=jax.sharding.SingleDeviceSharding(self.device)),
                         inputs)
    key = (jax.tree.structure(avals), tuple((a.shape, a.dtype, a.weak_type) for a in jax.tree.leaves(avals)))
    if key not in self._programs:
      self._programs[key] = self._jit.lower(*avals).compile()
    return self._programs[key]

  def __call__(self, *inputs: Any) -> Any:
    return self.compiled(*inputs)(*inputs)


def sweep(step: CompiledStep, params: Any, acc: Any, tokens: np.ndarray, batch_size: int, desc: str,
          *batched: np.ndarray, args: tuple = (), progress: bool = True) -> Any:
  """Fold every batch of ``tokens [N, T]`` (and of the arrays in ``batched``, batched alike) into ``acc``.

  Each batch is ``step(params, acc, tokens, seq_ids, *batched, *args)``;
  ``args`` are the same for every batch. ``acc`` is donated; a leaf that
  shares its buffer with an earlier one is copied first, because init
  functions may hand one zeros array to several leaves and a buffer cannot be
  donated twice (copying only those keeps the accumulators' memory at 1x: 4.3
  GiB for the probe of a 2,048-wide model). The progress bar advances when a
  batch has been computed, not when it has been dispatched.
  """
  from tqdm import tqdm

  seen: set[int] = set()

  def own(x: jax.Array) -> jax.Array:
    if id(x) in seen:
      return jnp.copy(x)
    seen.add(id(x))
    return x

  acc = step.put(jax.tree.map(own, acc))
  params, args = step.put(params), step.put(args)
  with tqdm(total=len(tokens), desc=desc, unit="seq", disable=not progress, leave=False, dynamic_ncols=True) as bar:
    for start in range(0, len(tokens), batch_size):
      stop = min(start + batch_size, len(tokens))
      inputs = step.put([tokens[start:stop], np.arange(start, stop, dtype=np.int32),
                         *(x[start:stop] for x in batched)])
      acc = jax.block_until_ready(step(params, acc, *inputs, *args))
      bar.update(stop - start)
  return acc
