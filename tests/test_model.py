"""The model: mask conventions, causality, position-0 closedness, tied/untied, fused == explicit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from abspos_jax import attention as attention_lib, layers, masks, model as model_lib
from abspos_jax import hooks as hooks_lib
from abspos_jax.hooks import Hooks
from conftest import small_config

T = 16


def tokens(seed, batch=2):
  return jax.random.randint(jax.random.key(seed), (batch, T), 0, 256)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_sliding_window_sees_exactly_its_keys(window):
  m = np.asarray(masks.causal_mask(10, window))
  for i in range(10):
    assert set(np.flatnonzero(m[i])) == set(range(max(0, i - window + 1), i + 1))
  np.testing.assert_array_equal(np.asarray(masks.num_visible(jnp.arange(10), window)), m.sum(1))


def test_causal_mask_and_counts():
  m = np.asarray(masks.causal_mask(6))
  np.testing.assert_array_equal(m, np.tril(np.ones((6, 6), bool)))
  np.testing.assert_array_equal(np.asarray(masks.num_visible(jnp.arange(6))), np.arange(1, 7))


def test_swa_attention_weights_respect_window():
  m = model_lib.create(small_config("swa"))
  hooks = Hooks(capture=["blocks.0.attn.weights"])
  m(tokens(0), hooks=hooks)
  a = np.asarray(hooks.cache["blocks.0.attn.weights"])
  np.testing.assert_array_equal(a > 0, np.broadcast_to(np.asarray(masks.causal_mask(T, 4)), a.shape))
  np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("position", model_lib.POSITIONS)
def test_future_tokens_change_nothing_before_them(position):
  m = model_lib.create(small_config(position))
  x = tokens(1)
  t = 7
  y = x.at[:, t + 1:].set(tokens(2)[:, t + 1:])
  hx, hy = Hooks(capture=lambda n: n.startswith("resid.")), Hooks(capture=lambda n: n.startswith("resid."))
  lx, ly = m(x, hooks=hx), m(y, hooks=hy)
  np.testing.assert_array_equal(lx[:, : t + 1], ly[:, : t + 1])
  for name in hx.cache:
    np.testing.assert_array_equal(hx.cache[name][:, : t + 1], hy.cache[name][:, : t + 1])
  assert not np.allclose(lx[:, t + 1:], ly[:, t + 1:])


@pytest.mark.parametrize("position", model_lib.POSITIONS)
def test_position_zero_is_closed(position):
  """h_0^l depends only on x_0: identical across inputs that share token 0."""
  m = model_lib.create(small_config(position))
  x = tokens(3, batch=4).at[:, 0].set(256)
  hooks = Hooks(capture=lambda n: n.startswith("resid."))
  m(x, hooks=hooks)
  for l in range(3):
    h0 = np.asarray(hooks.cache[f"resid.{l}"][:, 0])
    np.testing.assert_array_equal(h0, np.broadcast_to(h0[0], h0.shape))


@pytest.mark.parametrize("position", ["rope", "swa"])
def test_fused_path_equals_explicit(position):
  explicit = model_lib.create(small_config(position))
  fused = model_lib.create(small_config(position, **{"model.attention_impl": "fused"}))
  np.testing.assert_allclose(fused(tokens(4)), explicit(tokens(4)), atol=2e-5)


def test_hooks_capture_without_changing_output():
  m = model_lib.create(small_config())
  hooks = Hooks(capture=lambda n: True)
  np.testing.assert_array_equal(m(tokens(5)), m(tokens(5), hooks=hooks))
  c = hooks.cache
  assert c["blocks.1.attn.logits"].shape == (2, 4, T, T)
  np.testing.assert_allclose(jax.nn.logsumexp(c["blocks.1.attn.logits"], -1), c["blocks.1.attn.log_z"], rtol=1e-6)
  assert set(c) >= {"embed.tokens", "resid.0", "resid.2", "blocks.0.attn.out", "blocks.0.mlp.out"}


def test_edit_hook_renormalises_attention():
  """Removing key 0 from every query i >= 1 leaves weights that sum to 1 over the other keys."""
  m = model_lib.create(small_config())
  def no_sink(s):
    return s.at[:, :, 1:, 0].set(-jnp.inf)
  hooks = Hooks(edits={"blocks.0.attn.logits": no_sink}, capture=["blocks.0.attn.weights"])
  m(tokens(6), hooks=hooks)
  a = np.asarray(hooks.cache["blocks.0.attn.weights"])
  assert np.all(a[:, :, 1:, 0] == 0)
  np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("position,overrides,block", [("rope", {}, 4), ("swa", {"model.window": 3}, 8),
                                                       ("swa", {"model.window": 6}, 4),
                                                       ("rope", {"model.num_kv_heads": 2}, 2)])
def test_query_blocks_compute_what_one_block_does(position, overrides, block):
  """The analysis attention ``block`` queries at a time (windows shorter and longer than a block, grouped-query
  attention) gives the output, residual streams and ``log Z`` of all 16 at once, with and without a row-wise edit."""
  m = model_lib.create(small_config(position, **overrides))
  x = tokens(7)
  points = [hooks_lib.resid(l) for l in range(3)] + [hooks_lib.attn(l, "log_z") for l in range(2)]
  bonus = {hooks_lib.attn(1, "logits"): lambda s: s + 0.3 * jnp.arange(s.shape[-1])}
  for edits in ({}, bonus):
    whole, blocked = Hooks(edits, points), Hooks(edits, points, query_block=block)
    np.testing.assert_allclose(m(x, hooks=blocked), m(x, hooks=whole), rtol=1e-6, atol=1e-6)
    for name in points:
      np.testing.assert_allclose(blocked.cache[name], whole.cache[name], rtol=1e-6, atol=1e-6, err_msg=name)
  plain = Hooks(capture=points)
  m(x, hooks=plain)
  assert not np.allclose(whole.cache[hooks_lib.attn(1, "log_z")], plain.cache[hooks_lib.attn(1, "log_z")])


def test_key_bands_group_blocks_by_the_keys_their_queries_see():
  """Up to 4 bands of equally many blocks, each ending at its last query + 1 (the keys past it are masked for
  every query of the band); one band of all keys when the positions are not 0 .. T-1 known at trace time."""
  causal = np.arange(16)
  assert attention_lib.key_bands(16, 2, causal) == [(0, 4), (4, 8), (8, 12), (12, 16)]
  assert attention_lib.key_bands(16, 8, causal) == [(0, 8), (8, 16)]
  assert attention_lib.key_bands(16, 16, causal) == [(0, 16)]
  assert attention_lib.key_bands(12, 4, np.arange(12)) == [(0, 4), (4, 8), (8, 12)]
  assert attention_lib.key_bands(40, 2, np.arange(40)) == [(0, 10), (10, 20), (20, 30), (30, 40)]
  assert attention_lib.key_bands(16, 2, jnp.arange(16)) == [(0, 16)]
  assert attention_lib.key_bands(16, 2, np.arange(1, 17)) == [(0, 16)]


def test_a_windowed_block_scores_only_the_keys_of_its_window():
  """Under a window of W keys a block of R queries needs R + W - 1 keys (when that is fewer than T and the
  positions are 0 .. T-1 at trace time); the model then computes what one block does
  (test_query_blocks_compute_what_one_block_does)."""
  assert attention_lib.window_span(16, 4, 3, np.arange(16)) == 6
  assert attention_lib.window_span(16, 8, 6, np.arange(16)) == 13
  assert attention_lib.window_span(16, 8, 9, np.arange(16)) is None  # 16 keys: no saving
  assert attention_lib.window_span(16, 4, None, np.arange(16)) is None
  assert attention_lib.window_span(16, 16, 3, np.arange(16)) is None  # one block
  assert attention_lib.window_span(16, 4, 3, jnp.arange(16)) is None


class _KeyWidths:
  """A fold that records the (start, key_start, width) of each block it is given, in ``begin`` and after."""

  def __init__(self):
    self.first, self.main = [], []

  def begin(self, state, first_blocks):
    return first_blocks(lambda carry, start, s, lz, key_start=0: self._seen(self.first, carry, start, s,
                                                                           key_start), state)

  def __call__(self, state, start, s, lz, key_start=0):
    return self._seen(self.main, state, start, s, key_start)

  @staticmethod
  def _seen(log, state, start, s, key_start):
    jax.debug.callback(lambda a, b, w=s.shape[-1]: log.append((int(a), int(b), w)), start, key_start)
    return state + s.shape[0]


@pytest.mark.parametrize("window", [None, 3])
def test_the_first_sequence_s_references_are_scored_on_the_keys_the_blocks_see(window):
  """The fold's references (the first sequence, before the first block) run the very blocks the batch runs:
  the same key bands (or window spans), not every key for every block; ``first_blocks`` sees one sequence."""
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 16, 2, 4)) for i in range(3))
  fold = _KeyWidths()
  _, _, state = attention_lib.query_block_attention(q, k, v, np.arange(16), window, jnp.float32, 4, fold=fold,
                                                    state=jnp.int32(0), edited=False)
  jax.effects_barrier()
  expected = ([(s, max(0, min(s - 2, 16 - 6)), 6) for s in range(0, 16, 4)] if window else
              [(0, 0, 4), (4, 0, 8), (8, 0, 12), (12, 0, 16)])
  assert sorted(fold.first) == sorted(fold.main) == expected
  assert int(state) == 4 * 1 + 4 * 2  # 4 blocks: of 1 sequence in begin, of the batch of 2 after


def test_query_blocks_must_divide_the_length_and_whole_logits_stay_whole():
  m = model_lib.create(small_config())
  with pytest.raises(ValueError, match="query_block=5 must divide the sequence length 16"):
    m(tokens(1), hooks=Hooks(query_block=5))
  captured = Hooks(capture=[hooks_lib.attn(0, "weights")], query_block=4)
  m(tokens(1), hooks=captured)
  assert captured.query_block_size(T) == T and captured.cache[hooks_lib.attn(0, "weights")].shape == (2, 4, T, T)


def test_tied_and_untied_unembedding():
  tied = model_lib.create(small_config())
  untied = model_lib.create(small_config(**{"model.tie_embeddings": False}))
  assert not hasattr(tied, "unembed") and untied.unembed.shape == (32, 259)


def test_learned_positions_and_ntk_base_are_used():
  spec = model_lib.ModelSpec.from_config(small_config("ntk"))
  assert spec.attention_base() == pytest.approx(10000.0 * 8.0 ** (8 / 6))
  assert model_lib.ModelSpec.from_config(small_config("nope")).attention_base() is None
  assert model_lib.create(small_config("learned")).pos_embed.shape == (16, 32)


def test_layer_pattern():
  spec = model_lib.ModelSpec.from_config(small_config("swa", **{"model.num_layers": 5, "model.layer_pattern": "LG"}))
  assert spec.layer_windows() == (4, None, 4, None, 4)


@pytest.mark.parametrize("position", ["rope", "swa"])
def test_grouped_query_attention_and_biases(position):
  """GQA (2 kv heads for 4 query heads) with q/k/v biases: fused == explicit, and hooks stay per query head."""
  gqa = {"model.num_kv_heads": 2, "model.qkv_bias": True}
  explicit = model_lib.create(small_config(position, **gqa))
  fused = model_lib.create(small_config(position, **gqa, **{"model.attention_impl": "fused"}))
  for m in (explicit, fused):
    for block in m.blocks:
      block.attn.bq[...] = jax.random.normal(jax.random.key(1), block.attn.bq.shape)
      block.attn.bk[...] = jax.random.normal(jax.random.key(2), block.attn.bk.shape)
  assert explicit.blocks[0].attn.wk.shape == (32, 2, 8) and explicit.blocks[0].attn.bv.shape == (2, 8)
  np.testing.assert_allclose(fused(tokens(4)), explicit(tokens(4)), atol=2e-5)
  hooks = Hooks(capture=["blocks.1.attn.logits"])
  explicit(tokens(4), hooks=hooks)
  assert hooks.cache["blocks.1.attn.logits"].shape == (2, 4, T, T)


def test_gqa_equals_multi_head_with_repeated_kv_heads():
  """Query head n reads kv head n // (H/K): GQA is MHA whose k/v heads are repeated in that order."""
  gqa = model_lib.create(small_config(**{"model.num_kv_heads": 2}))
  mha = model_lib.create(small_config())
  for a, b in zip(gqa.blocks, mha.blocks):
    b.attn.wq[...], b.attn.wo[...] = a.attn.wq[...], a.attn.wo[...]
    b.attn.wk[...] = jnp.repeat(a.attn.wk[...], 2, axis=1)
    b.attn.wv[...] = jnp.repeat(a.attn.wv[...], 2, axis=1)
    for name in ("attn_norm", "mlp_norm", "mlp"):
      setattr(b, name, getattr(a, name))
  mha.embed[...] = gqa.embed[...]
  np.testing.assert_allclose(gqa(tokens(5)), mha(tokens(5)), atol=1e-5)


def _autodiff_attention(q, k, v, positions, window):
  """softmax_attention's own forward over all keys, differentiated by autodiff instead of its hand-written
  backward."""
  positions = jnp.asarray(positions)
  return attention_lib._softmax_attention_fwd(q, k, v, positions, positions, window)[0]


@pytest.mark.parametrize("block_causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads,window", [(4, 4, None), (4, 2, None), (4, 1, 5), (2, 2, 1)])
def test_hand_written_attention_gradient_equals_autodiff(heads, kv_heads, window, block_causal):
  """softmax_attention's backward (ds = a (dp - delta)) == autodiff through the mask and logsumexp over all
  keys; with NumPy positions 0..T-1 it runs block-causal (QUERY_BLOCKS query blocks, each on its key prefix)."""
  kq, kk, kv, kw = jax.random.split(jax.random.key(heads * 10 + kv_heads), 4)
  q = jax.random.normal(kq, (2, T, heads, 8))
  k, v = jax.random.normal(kk, (2, T, kv_heads, 8)), jax.random.normal(kv, (2, T, kv_heads, 8))
  w = jax.random.normal(kw, (2, T, heads, 8))
  positions = np.arange(T) if block_causal else jnp.arange(T)
  assert attention_lib.QUERY_BLOCKS > 1 and T % attention_lib.QUERY_BLOCKS == 0  # the blocked path runs
  grads = [
      jax.grad(lambda q, k, v, f=f: jnp.sum(f(q, k, v, positions, window) * w), argnums=(0, 1, 2))(q, k, v)
      for f in (attention_lib.softmax_attention, _autodiff_attention)
  ]
  hand, auto = (f(q, k, v, positions, window) for f in (attention_lib.softmax_attention, _autodiff_attention))
  if block_causal:  # the blocks' softmax sums skip the masked zeros: equal up to float32 rounding
    np.testing.assert_allclose(hand, auto, rtol=1e-6, atol=1e-6)
  else:
    np.testing.assert_array_equal(hand, auto)
  for hand, auto in zip(*grads):
    np.testing.assert_allclose(hand, auto, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hand_written_swiglu_gradient_equals_autodiff(dtype):
  """layers.swiglu's backward == autodiff of its forward: to float32 rounding in float32; in bfloat16
  within bf16 rounding of the float32 gradients (its residuals and [dg, du] are rounded to bf16)."""
  kx, kw, kd, kg = jax.random.split(jax.random.key(3), 4)
  x = jax.random.normal(kx, (2, T, 16))
  w, wd = jax.random.normal(kw, (16, 2 * 24)) / 4, jax.random.normal(kd, (24, 16)) / 5
  g = jax.random.normal(kg, (2, T, 16))
  autodiff = lambda x, w, wd: layers._swiglu_fwd(x, w, wd, jnp.float32)[0]  # its forward, through autodiff
  want = jax.grad(lambda *a: jnp.sum(autodiff(*a) * g), argnums=(0, 1, 2))(x, w, wd)
  got = jax.grad(lambda *a: jnp.sum(layers.swiglu(*a, dtype=dtype) * g), argnums=(0, 1, 2))(x, w, wd)
  for a, b in zip(got, want):
    assert a.dtype == jnp.float32
    if dtype == "float32":
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    else:
      assert 1e-4 < float(jnp.linalg.norm(a - b)) <= 1e-2 * float(jnp.linalg.norm(b))


@pytest.mark.parametrize("position", ["rope", "swa"])
def test_training_gradient_equals_hook_path_gradient(position):
  """The loss gradient of the training path (hand-written attention backward) == the hook path's (autodiff)."""
  m = model_lib.create(small_config(position, **{"model.num_kv_heads": 2, "model.qkv_bias": True}))
  graphdef, params = nnx.split(m, nnx.Param)
  x = tokens(9)

  def loss(params, hooks):
    logits = nnx.merge(graphdef, params)(x, hooks=hooks() if hooks else None)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  train = jax.grad(loss)(params, None)
  hooked = jax.grad(loss)(params, lambda: Hooks(capture=[]))
  for a, b in zip(jax.tree.leaves(train), jax.tree.leaves(hooked)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_low_precision_einsum_gradients_are_bf16_products_of_the_float32_ones():
  """precision.einsum in bf16: forward and both gradients equal float32 math on bf16-rounded operands."""
  from abspos_jax import precision
  x = jax.random.normal(jax.random.key(0), (3, 5, 8))
  w = jax.random.normal(jax.random.key(1), (8, 6))
  g = jax.random.normal(jax.random.key(2), (3, 5, 6))
  r = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  y, vjp = jax.vjp(lambda a, b: precision.einsum("btd,df->btf", a, b, jnp.bfloat16), x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == jnp.float32
  np.testing.assert_allclose(y, jnp.einsum("btd,df->btf", r(x), r(w)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, jnp.einsum("btf,df->btd", r(g), r(w)), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, jnp.einsum("btd,btf->df", r(x), r(g)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"num_kv_heads": 2, "qkv_bias": True}, {"tie_embeddings": False},
                                       {"position": "learned"}, {"attention_impl": "fused"}])
def test_bf16_train_step_runs_and_tracks_float32(overrides):
  """Every variant compiles in bf16 on this backend (no unsupported bf16 dot) and its loss and gradients
  stay within bf16 rounding of float32."""
  losses, grads = {}, {}
  for dtype in ("float32", "bfloat16"):
    c = small_config(**{"model." + k: v for k, v in {**overrides, "dtype": dtype}.items()})
    model = model_lib.create(c)
    graphdef, params = nnx.split(model, nnx.Param)
    t = tokens(0)
    loss_fn = lambda p: jnp.mean(-jax.nn.log_softmax(nnx.merge(graphdef, p)(t[:, :-1]))[
        jnp.arange(t.shape[0])[:, None], jnp.arange(t.shape[1] - 1)[None], t[:, 1:]])
    losses[dtype], grads[dtype] = jax.jit(jax.value_and_grad(loss_fn))(params)
  np.testing.assert_allclose(losses["bfloat16"], losses["float32"], rtol=1e-2)
  for a, b in zip(jax.tree.leaves(grads["bfloat16"]), jax.tree.leaves(grads["float32"])):
    assert a.dtype == jnp.float32
    assert float(jnp.linalg.norm(a - b)) <= 0.05 * float(jnp.linalg.norm(b)) + 1e-6
