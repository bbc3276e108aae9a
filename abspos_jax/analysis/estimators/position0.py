"""Position-0 trajectory, closedness and the fingerprint of token ``x_0``.

Input per batch: the residual stream ``h [B, L+1, T, D]`` (index 0 = embedding
output, ``l`` = after block ``l``) and the model inputs ``tokens [B, T]``
(``x_0 = tokens[:, 0]``). ``h_0^l`` is the stream at position 0 after layer ``l``.

* ``pos0_norm [L+1]``: mean over sequences of ``||h_0^l||``.
* ``pos0_cos_prev [L]``: mean over sequences of ``cos(h_0^l, h_0^{l-1})``,
  ``l = 1..L`` (0 for a zero vector).
* ``pos0_norm_ratio [L+1]``: ``mean ||h_0^l|| / mean_{i >= 1} ||h_i^l||`` (NaN for T = 1).
* ``fingerprint_spread [L+1]``: ``sqrt(mean ||h_0 - mean h_0||^2) / mean ||h_0||``.
* Grouped by ``x_0`` (groups g with ``n_g`` sequences and means ``mu_g``):
  ``fingerprint_within = sqrt(sum_g sum_{k in g} ||h_0 - mu_g||^2 / n) / mean ||h_0||``,
  ``fingerprint_between = sqrt(sum_g n_g ||mu_g - mu||^2 / n) / mean ||h_0||``
  (so ``within^2 + between^2 = spread^2``), and ``fingerprint_group_cos``: the
  mean over ordered pairs of distinct groups of ``cos(mu_g, mu_g')``, each group
  counted once whatever its size (NaN with fewer than two groups).

Sums of squares are taken about references fixed at first sight: per group the
first ``h_0`` of that token, globally the first sequence's ``h_0``. Inputs that
share ``x_0`` in a causal model give bitwise-equal ``h_0``, so their within
spread is exactly 0 and, with one group, the spread is exactly 0. Memory:
``V * (L+1) * D`` floats for the groups, where ``V`` is the number of token
ids ``x_0`` may take; the analysis pass gives it dense group ids (one per
first token that occurs) so that a 32k-150k vocabulary costs nothing extra.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.outputs import schema


def _cos(a: jax.Array, b: jax.Array) -> jax.Array:
  """Cosine along the last axis, 0 where either vector is 0."""
  den = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.where(den > 0, (a * b).sum(-1) / jnp.where(den > 0, den, 1.0), 0.0)


def init(num_layers: int, d_model: int, vocab_size: int) -> dict:
  """Zero accumulator for ``h [B, num_layers + 1, T, D]`` and tokens in ``[0, vocab_size)``."""
  s = num_layers + 1
  zeros = lambda *shape: jnp.zeros(shape, jnp.float32)
  return dict(n=zeros(), sum_norm0=zeros(s), sum_norm_rest=zeros(s),
              n_rest=zeros(), sum_cos_prev=zeros(num_layers),
              ref=zeros(s, d_model), group_n=zeros(vocab_size),
              group_ref=zeros(vocab_size, s, d_model),
              group_sum=zeros(vocab_size, s, d_model),
              group_sq=zeros(vocab_size, s))


def update(acc: dict, h: jax.Array, tokens: jax.Array) -> dict:
  """Adds a batch: ``h [B, L+1, T, D]``, ``tokens`` int ``[B, T]``."""
  h = h.astype(jnp.float32)
  h0, x0 = h[:, :, 0], tokens[:, 0]
  norms = jnp.linalg.norm(h, axis=-1)  # [B, L+1, T]
  seen = acc["group_n"] > 0
  # Any one h_0 of an unseen token becomes its reference (scatter picks one).
  first = acc["group_ref"].at[x0].set(h0)
  group_ref = jnp.where(seen[:, None, None], acc["group_ref"], first)
  y = h0 - group_ref[x0]
  return dict(
      n=acc["n"] + h.shape[0],
      sum_norm0=acc["sum_norm0"] + norms[:, :, 0].sum(0),
      sum_norm_rest=acc["sum_norm_rest"] + norms[:, :, 1:].sum((0, 2)),
      n_rest=acc["n_rest"] + h.shape[0] * (h.shape[2] - 1),
      sum_cos_prev=acc["sum_cos_prev"] + _cos(h0[:, 1:], h0[:, :-1]).sum(0),
      ref=jnp.where(acc["n"] > 0, acc["ref"], h0[0]),
      group_n=acc["group_n"].at[x0].add(1.0),
      group_ref=group_ref,
      group_sum=acc["group_sum"].at[x0].add(y),
      group_sq=acc["group_sq"].at[x0].add((y * y).sum(-1)))


@jax.jit
def finalize(acc: dict) -> dict[str, jax.Array]:
  """Returns ``pos0_norm, pos0_norm_ratio, fingerprint_spread, fingerprint_within,
  fingerprint_between, fingerprint_group_cos`` ``[L+1]``, ``pos0_cos_prev [L]``,
  ``num_groups []``.
  """
  n = jnp.maximum(acc["n"], 1.0)
  mean_norm = acc["sum_norm0"] / n
  ng = acc["group_n"]
  present = ng > 0
  ngc = jnp.maximum(ng, 1.0)[:, None, None]
  within_ss = jnp.where(present[:, None], acc["group_sq"]
                        - (acc["group_sum"] ** 2).sum(-1) / ngc[..., 0], 0.0)
  within_ss = jnp.maximum(within_ss.sum(0), 0.0)
  # Group means relative to the global reference; their weighted mean is mu - ref.
  delta = jnp.where(present[:, None, None],
                    acc["group_ref"] - acc["ref"] + acc["group_sum"] / ngc, 0.0)
  centre = (ng[:, None, None] * delta).sum(0) / n
  between_ss = (ng[:, None] * ((delta - centre) ** 2).sum(-1)).sum(0)
  rel = lambda ss: jnp.sqrt(ss / n) / mean_norm
  mu = acc["group_ref"] + acc["group_sum"] / ngc
  mu_norm = jnp.linalg.norm(mu, axis=-1, keepdims=True)
  ok = present[:, None, None] & (mu_norm > 0)
  unit = jnp.where(ok, mu / jnp.where(ok, mu_norm, 1.0), 0.0)
  g = present.sum()
  # sum over ordered pairs g != g' of u_g . u_g' = ||sum_g u_g||^2 - sum_g ||u_g||^2
  pair_sum = (unit.sum(0) ** 2).sum(-1) - (unit ** 2).sum((0, 2))
  n_rest = acc["n_rest"]
  rest_norm = acc["sum_norm_rest"] / jnp.maximum(n_rest, 1.0)
  return dict(
      pos0_norm=mean_norm,
      pos0_cos_prev=acc["sum_cos_prev"] / n,
      pos0_norm_ratio=jnp.where(n_rest > 0, mean_norm / rest_norm, jnp.nan),
      fingerprint_spread=rel(within_ss + between_ss),
      fingerprint_within=rel(within_ss),
      fingerprint_between=rel(between_ss),
      fingerprint_group_cos=jnp.where(g >= 2, pair_sum / jnp.maximum(g * (g - 1), 1),
                                      jnp.nan),
      num_groups=g)


def closedness_max_abs_diff(h_a: jax.Array, h_b: jax.Array) -> jax.Array:
  """``max_{b, k} |h_a[b, l, 0, k] - h_b[b, l, 0, k]|`` per layer: ``[B, L+1, T, D] -> [L+1]``.

  For two forward passes whose inputs share token 0 and differ after it; 0 in
  a causal model.
  """
  return jnp.abs(h_a[:, :, 0] - h_b[:, :, 0]).max((0, 2))


INTERVAL_KEYS = ()  # deterministic given the inputs: no interval


def summarize(fin: dict[str, jax.Array], ci: dict) -> dict:
  """summary.json's ``position0`` from :func:`finalize`'s results (per layer, embedding output first)."""
  return {"position0": {"norm": schema.tolist(fin["pos0_norm"]), "norm_ratio": schema.tolist(fin["pos0_norm_ratio"]),
                        "cos_prev": schema.tolist(fin["pos0_cos_prev"])}}


def summarize_fingerprints(by_policy: dict[str, dict[str, jax.Array]]) -> dict:
  """summary.json's ``fingerprint``: :func:`finalize`'s results per BOS policy (``prepend`` as ``bos``,
  ``none`` as ``no_bos``)."""
  out = {}
  for policy, key in (("prepend", "bos"), ("none", "no_bos")):
    if policy in by_policy:
      p0 = by_policy[policy]
      out[key] = schema.tolist(p0["fingerprint_spread"])
      for part in ("group_cos", "within", "between"):
        out[f"{key}_{part}"] = schema.tolist(p0["fingerprint_" + part])
      out[f"{key}_num_groups"] = int(p0["num_groups"])
  return out


def arrays(fin: dict[str, jax.Array], ci: dict) -> dict[str, np.ndarray]:
  """stats.npz's position-0 arrays, each ``[layer + 1]``."""
  return {name: np.asarray(fin[name]) for name in ("pos0_norm", "pos0_norm_ratio", "pos0_cos_prev",
                                                    "fingerprint_spread")}
