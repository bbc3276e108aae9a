"""The analysis steps (analysis/passes/steps.py): folding layer by layer, the lighter step of the other policy, one
layer of logits held at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax.analysis.core import fingerprint_groups, layer_visible
from abspos_jax.analysis.estimators import denominators, fixed_effects, leakage
from abspos_jax.analysis.passes import edits, steps
from abspos_jax.hooks import Hooks
from conftest import small_config
from helpers import sequences


def _assert_sums_close(want, have):
  """Accumulators equal to float32 rounding: sums of terms of order 1 (centred ones, 1e-5 apart) or of the largest
  sum (1e-6 of it: sums over up to 16 cells of the accumulator's own size that cancel)."""
  def close(w, h):
    np.testing.assert_allclose(h, w, rtol=1e-5, atol=max(1e-5, 1e-6 * float(np.max(np.abs(w)))))
  jax.tree.map(close, want, have)


@pytest.mark.parametrize("query_block", [None, 4])
def test_layer_by_layer_folding_equals_all_layers_at_once(query_block):
  """``fold_pass`` (each layer folded as it runs, all 16 queries at once or 4 at a time) against the estimators on
  every layer's captured logits.

  Local and global layers alternate, so each layer has its own design slice.
  """
  m = model_lib.create(small_config("swa", **{"model.num_layers": 3, "model.layer_pattern": "LG"}))
  toks = jnp.asarray(sequences()["prepend"][:6])
  ids = jnp.arange(6) + 3
  visible = layer_visible(m.spec, toks.shape[1])
  design = fixed_effects.make_design(visible)
  L, H, T = m.spec.num_layers, m.spec.num_heads, toks.shape[1]
  hooks = Hooks(capture=lambda name: name.startswith("blocks.") and name.endswith(("logits", "log_z")))
  m(toks, hooks=hooks)
  logits = jnp.stack([hooks.cache[f"blocks.{l}.attn.logits"] for l in range(L)], 1)
  log_z = jnp.stack([hooks.cache[f"blocks.{l}.attn.log_z"] for l in range(L)], 1)
  start = {"leakage": leakage.init(L, H, T, 4), "denominators": denominators.init(L, H, T, 4)}
  for _ in range(2):  # the second batch reads the first one's references
    want_lk, want_zres, _ = leakage.update(start["leakage"], logits, log_z, ids, design)
    want_den = denominators.update(start["denominators"], logits, log_z, visible, ids)
    got, _, zres, qstats = jax.jit(lambda a: steps.fold_pass(m, a, toks, ids, design, query_block=query_block))(
        start)
    for want, have in ((want_lk, got["leakage"]), (want_den, got["denominators"]), (want_zres, zres)):
      _assert_sums_close(want, have)
    np.testing.assert_allclose(qstats["entropy"], denominators.query_statistics(logits, log_z, visible)["entropy"],
                               rtol=1e-5, atol=1e-6)
    start = got


def test_the_other_policy_step_equals_the_baseline_steps_position0_closedness_and_loss():
  """The non-main BOS policy runs a plain forward; its fingerprint, closedness and loss sums are the full step's."""
  m = model_lib.create(small_config())
  toks = jnp.asarray(sequences()["none"][:6])
  graphdef, params = nnx.split(m, nnx.Param)
  _, x0_groups = fingerprint_groups({"none": np.asarray(toks)}, m.spec.vocab_size)
  design = fixed_effects.make_design(layer_visible(m.spec, toks.shape[1]))
  full = jax.jit(steps.make_baseline_step(graphdef, design, {}, jnp.asarray(x0_groups)))
  light = jax.jit(steps.make_position0_step(graphdef, jnp.asarray(x0_groups)))
  groups = int(x0_groups.max()) + 1
  want = steps.init_accumulators(m.spec, toks.shape[1], {}, 4, num_groups=groups)
  got = steps.init_position0_pass(m.spec, groups)
  assert set(got) == {"position0", "closedness", "loss_sum", "loss_count"}
  for ids in (jnp.arange(3), jnp.arange(3, 6)):  # the first batch runs the closedness check, the second skips it
    want = full(params, want, toks[ids], ids)
    got = light(params, got, toks[ids], ids)
    jax.tree.map(lambda w, h: np.testing.assert_allclose(h, w, rtol=1e-5, atol=1e-6),
                 {k: want[k] for k in got}, got)
  assert float(got["closedness"].max()) == 0.0 and float(got["loss_count"]) == 6 * (toks.shape[1] - 1)


def test_the_pass_holds_one_layer_of_logits():
  """Compiled scratch memory of the baseline step: flat in depth (before folding: +100 MiB from 2 to 8 layers)."""
  def scratch_mib(num_layers):
    m = model_lib.create(small_config(**{"model.num_layers": num_layers, "data.seq_len": 256}))
    graphdef, params = nnx.split(m, nnx.Param)
    design = fixed_effects.make_design(layer_visible(m.spec, 256))
    step = steps.make_baseline_step(graphdef, design, {})
    acc = steps.init_accumulators(m.spec, 256, {}, 16)
    compiled = jax.jit(step).lower(params, acc, jnp.zeros((8, 256), jnp.int32), jnp.arange(8)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / 2**20

  one_layer = 8 * 4 * 256 * 256 * 4 / 2**20  # [B, H, T, T] float32: 8 MiB
  assert scratch_mib(8) - scratch_mib(2) < one_layer


def test_sink_ablation_in_query_blocks_equals_one_block():
  """The per-head ``sink_ablate`` pass (its edit on each block's rows, per-head cells) 4 queries at a time against all
  16 at once: the same accumulators, the edit's effect included (key 0 gone from the ablated heads' queries i >= 1)."""
  m = model_lib.create(small_config(**{"model.num_layers": 2}))
  toks = jnp.asarray(sequences()["prepend"][:4])
  ids = jnp.arange(4)
  L, H, T = m.spec.num_layers, m.spec.num_heads, toks.shape[1]
  visible = layer_visible(m.spec, T)
  heads = np.zeros((L, H), bool)
  heads[0, 1] = heads[1, 3] = True
  design = fixed_effects.make_design(edits.sink_cells(visible, heads))
  start = {"leakage": leakage.init(L, H, T, 4), "denominators": denominators.init(L, H, T, 4)}
  run = jax.jit(lambda a, block: steps.fold_pass(m, a, toks, ids, design, edits.sink_ablate(jnp.asarray(heads)),
                                                 query_block=block), static_argnums=1)
  whole, blocked = run(start, None), run(start, 4)
  _assert_sums_close(whole[0], blocked[0])
  mass = whole[3]["sink_mass"]  # [B, L, H, T]
  assert float(jnp.abs(mass[:, 0, 1, 1:]).max()) == 0.0 and float(mass[:, 0, 0, 1:].min()) > 0.0
