"""Absolute-position leakage of logits and log-weights, and its exact split.

Per layer ``l`` and head ``h`` the pair quantities are the logits ``s_ij`` and
the log-weights ``log a_ij = s_ij - log Z_i`` on the visible cells.

Held-out leakage (per quantity X in {s, loga}): ``R^2_A - R^2_B`` of the
two-way and offset-only fixed-effects models (``fixed_effects.heldout_r2``),
fit on even sequence ids and scored on odd ones. Pooled per layer and overall
as the mean over heads (over all (layer, head) pairs) of the per-head values.

Exact split, fit on all sequences' cell means. ``E_i = mean log Z_i - log|V(i)|``
and ``log|V(i)|`` depend on ``i`` only, so their centred query effects are
``f - cell_mean(f)`` and, the fit being linear,
``phi_loga = phi_s - phi_E - phi_logV`` (assembled this way; the direct fit of
the log-weight means is reported as ``phi_identity_err``). Over a set of cells
with uniform cell weights (query ``i`` counts ``|V(i)|`` times), each phi
re-centred on that set:

* ``var_phi = Var(phi_loga)``, ``cov_mask = Cov(phi_loga, -phi_logV)``,
  ``cov_res = Cov(phi_loga, phi_s - phi_E)`` (nats^2; ``cov_mask + cov_res =
  var_phi`` exactly);
* ``var_total = Var(log a)`` over all (sequence, cell) observations in the set;
* ``leakage_share = var_phi / var_total``, ``comp_mask = cov_mask / var_total``,
  ``comp_res = cov_res / var_total``, ``share_mask = cov_mask / var_phi``,
  ``share_res = cov_res / var_phi`` (sum to 1; either may be negative).

Cell sets: all visible cells, and ``early_``: the cells of queries
``1 <= i < early_max``. Pooled per layer (suffix ``_layer``) and overall
(``_overall``) by averaging the variances and covariances over heads (over all
(layer, head) pairs) before dividing.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from abspos_jax.analysis import fixed_effects as fe

_BASE = ("var_phi", "var_total", "cov_mask", "cov_res")
_RATIOS = {"leakage_share": ("var_phi", "var_total"),
           "comp_mask": ("cov_mask", "var_total"),
           "comp_res": ("cov_res", "var_total"),
           "share_mask": ("cov_mask", "var_phi"),
           "share_res": ("cov_res", "var_phi")}


def _div(a: jax.Array, b: jax.Array) -> jax.Array:
  """``a / b``, NaN where ``b`` is not positive."""
  return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), jnp.nan)


def fraction_removed(before: jax.Array, after: jax.Array,
                     atol: float = 1e-8) -> jax.Array:
  """``1 - after / before`` for raw covariances (nats^2); NaN where ``|before| <= atol``."""
  ok = jnp.abs(before) > atol
  return jnp.where(ok, 1.0 - after / jnp.where(ok, before, 1.0), jnp.nan)


def init(num_layers: int, num_heads: int, seq_len: int) -> dict:
  """Zero accumulator.

  Held-out stats (``fixed_effects.heldout_init``) of ``s`` and ``loga`` with
  ``s1, s2 [L, H, 2, T, T]``, and ``log_z_sum [L, H, T]`` over all sequences.
  """
  shape = (num_layers, num_heads, seq_len, seq_len)
  return dict(s=fe.heldout_init(shape), loga=fe.heldout_init(shape),
              log_z_sum=jnp.zeros(shape[:-1], jnp.float32))


def update(acc: dict, logits: jax.Array, log_z: jax.Array, seq_ids: jax.Array,
           visible: jax.Array) -> dict:
  """Adds a batch.

  Args:
    acc: from ``init``.
    logits: ``[B, L, H, T, T]``; entries off ``visible`` are ignored (may be -inf).
    log_z: ``[B, L, H, T]``, ``logsumexp`` of the visible logits of each query.
    seq_ids: int ``[B]``; even ids fit, odd ids score the held-out R^2.
    visible: bool ``[T, T]`` (all layers) or ``[L, T, T]``.
  """
  vis = fe.layer_mask(visible)
  loga = jnp.where(vis, logits - log_z[..., None], 0.0)
  return dict(s=fe.heldout_update(acc["s"], logits, vis, seq_ids),
              loga=fe.heldout_update(acc["loga"], loga, vis, seq_ids),
              log_z_sum=acc["log_z_sum"] + log_z.astype(jnp.float32).sum(0))


def _moments(design: fe.FEDesign, acc_loga: dict, phi_loga: jax.Array,
             mask_part: jax.Array, res_part: jax.Array,
             queries: jax.Array) -> dict[str, jax.Array]:
  """``_BASE`` moments ``[H]`` over the cells of the queries in ``queries [T]``."""
  w = design.query_count * queries
  total_w = w.sum()

  def centre(f: jax.Array) -> jax.Array:
    return f - (w * f).sum(-1, keepdims=True) / jnp.maximum(total_w, 1.0)

  def mean(f: jax.Array) -> jax.Array:
    return jnp.where(total_w > 0, (w * f).sum(-1) / jnp.maximum(total_w, 1.0), jnp.nan)

  a = centre(phi_loga)
  n = acc_loga["n"].sum()
  cells = design.visible & queries[:, None]
  tss = fe.total_sum_squares(acc_loga["s1"].sum(-3), acc_loga["s2"].sum(-3), n,
                             acc_loga["ref"], cells)
  return dict(var_phi=mean(a * a), cov_mask=mean(a * centre(mask_part)),
              cov_res=mean(a * centre(res_part)),
              var_total=tss / jnp.where(total_w > 0, n * total_w, jnp.nan))


def _layer(acc: dict, design: fe.FEDesign, early_max: int) -> dict[str, jax.Array]:
  """Everything of one layer: ``acc`` leaves ``[H, ...]``, one mask."""
  out = {}
  for name in ("s", "loga"):
    r2 = fe.heldout_r2(design, acc[name])
    out[f"r2_two_way_{name}"] = r2["two_way"]
    out[f"r2_offset_{name}"] = r2["offset"]
    out[f"leakage_{name}"] = r2["two_way"] - r2["offset"]
  n = jnp.maximum(acc["s"]["n"].sum(), 1.0)
  log_v = jnp.log(design.query_count)
  phi_s = fe.fit_two_way(design, fe.pooled_cell_means(acc["s"]))["phi"]
  phi_e = fe.query_function_effect(design, acc["log_z_sum"] / n - log_v)
  phi_logv = fe.query_function_effect(design, log_v)
  phi_loga = phi_s - phi_e - phi_logv
  direct = fe.fit_two_way(design, fe.pooled_cell_means(acc["loga"]))["phi"]
  out.update(phi_s=phi_s, phi_E=phi_e, phi_logV=phi_logv, phi_loga=phi_loga,
             phi_identity_err=jnp.abs(direct - phi_loga).max(-1))
  q = jnp.arange(log_v.shape[-1])
  for prefix, queries in (("", jnp.ones_like(q, bool)),
                          ("early_", (q >= 1) & (q < early_max))):
    m = _moments(design, acc["loga"], phi_loga, -phi_logv, phi_s - phi_e, queries)
    out.update({prefix + k: v for k, v in m.items()})
  return out


@functools.partial(jax.jit, static_argnames="early_max")
def finalize(acc: dict, design: fe.FEDesign, early_max: int = 16) -> dict[str, jax.Array]:
  """Leakage and component statistics.

  Args:
    acc: from ``update``.
    design: ``fixed_effects.make_design(visible)``, one mask ``[T, T]`` for all
      layers or one per layer ``[L, T, T]``.
    early_max: the early cells are those of queries ``1 <= i < early_max``.

  Returns (``X`` in {s, loga}; ``P`` in {"", "early_"}; ``Q`` any of
  ``var_phi, var_total, cov_mask, cov_res, leakage_share, comp_mask, comp_res,
  share_mask, share_res``):
    ``r2_two_way_X, r2_offset_X, leakage_X [L, H]``, ``leakage_X_layer [L]``,
    ``leakage_X_overall []``; ``phi_s, phi_E, phi_loga [L, H, T]``,
    ``phi_logV [L, T]``, ``phi_identity_err [L, H]``; ``PQ [L, H]``,
    ``PQ_layer [L]``, ``PQ_overall []``.
  """
  design_axis = 0 if design.visible.ndim == 3 else None
  out = jax.vmap(functools.partial(_layer, early_max=early_max),
                 in_axes=(dict(s=dict(s1=0, s2=0, n=None, ref=0),
                               loga=dict(s1=0, s2=0, n=None, ref=0),
                               log_z_sum=0), design_axis))(acc, design)
  for name in ("s", "loga"):
    out[f"leakage_{name}_layer"] = out[f"leakage_{name}"].mean(-1)
    out[f"leakage_{name}_overall"] = out[f"leakage_{name}"].mean()
  for prefix in ("", "early_"):
    for scope, pool in (("_layer", lambda x: x.mean(-1)), ("_overall", jnp.mean)):
      for k in _BASE:
        out[prefix + k + scope] = pool(out[prefix + k])
    for scope in ("", "_layer", "_overall"):
      for k, (num, den) in _RATIOS.items():
        out[prefix + k + scope] = _div(out[prefix + num + scope], out[prefix + den + scope])
  return out
