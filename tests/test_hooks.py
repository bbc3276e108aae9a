"""Hook points (abspos_jax/hooks.py): names from one module, every point reachable, unknown names refused."""

import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import attention, hooks
from abspos_jax.attention import softmax_attention
from abspos_jax import model as model_lib
from conftest import small_config


def test_constructors_and_layer_of_agree():
  assert hooks.resid(3) == "resid.3" and hooks.attn(2, "log_z") == "blocks.2.attn.log_z"
  assert hooks.mlp_out(1) == "blocks.1.mlp.out"
  assert [hooks.layer_of(n) for n in (hooks.resid(5), hooks.attn(7, "logits"), hooks.mlp_out(0),
                                      hooks.EMBED_TOKENS)] == [5, 7, 0, None]
  assert hooks.is_attn(hooks.attn(4, "weights"), "weights") and not hooks.is_attn(hooks.attn(4, "out"), "weights")
  with pytest.raises(ValueError, match=r"attention hook point 'logit' does not exist; it is one of logits, log_z"):
    hooks.attn(0, "logit")


def test_every_point_is_reached_in_order():
  m = model_lib.create(small_config())
  h = hooks.Hooks(capture=lambda n: True)
  m(jnp.zeros((1, 5), jnp.int32), hooks=h)
  assert list(h.cache) == hooks.points(2) and len(hooks.points(2)) == 2 + 6 * 2


@pytest.mark.parametrize("edits,capture", [({"blocks.0.attn.logit": lambda x: x}, ()), ({}, ["resid.3"]),
                                           ({"blocks.2.attn.logits": lambda x: x}, ())])
def test_an_unknown_point_is_refused_with_the_valid_ones(edits, capture):
  """A misspelt edit, a capture past the last block, a block the model does not have: raised, not ignored."""
  m = model_lib.create(small_config())
  with pytest.raises(ValueError, match=r"unknown hook point\(s\) .*; a 2-block model has embed\.tokens, resid\.0 "
                                       r"\.\. resid\.2, blocks\.\{0\.\.1\}\.attn\.\{logits,log_z,weights,out\}"):
    m(jnp.zeros((1, 5), jnp.int32), hooks=hooks.Hooks(edits, capture))


def test_an_edit_changes_the_forward():
  m = model_lib.create(small_config())
  x = jnp.asarray(np.arange(10).reshape(1, 10) % 7)
  edited = hooks.Hooks({hooks.attn(0, "logits"): lambda s: s.at[..., 0].set(-jnp.inf)},
                       [hooks.attn(0, "weights")])
  out = m(x, hooks=edited)
  w = np.asarray(edited.cache[hooks.attn(0, "weights")])
  assert (w[..., 1:, 0] == 0).all() and not np.allclose(out, m(x))


def test_a_layer_whose_attention_nothing_reads_runs_the_plain_path(monkeypatch):
  """Capturing residual streams (or editing an MLP) leaves the attention to the training path; capturing or
  editing a layer's logits, weights or log Z keeps the explicit path for that layer. Both give the same
  residual streams to float32 rounding (the plain path cuts causal query blocks; docs/analysis.md)."""
  m = model_lib.create(small_config())
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 16)), jnp.int32)
  resids = [hooks.resid(l) for l in range(3)]
  plain = hooks.Hooks(capture=resids)
  assert not plain.reads_attention(0) and not hooks.Hooks({hooks.mlp_out(0): lambda x: x}).reads_attention(0)
  read = hooks.Hooks(capture=resids + [hooks.attn(1, "log_z")])
  assert not read.reads_attention(0) and read.reads_attention(1)
  assert hooks.Hooks(capture=lambda n: True).reads_attention(0)
  plain_calls = []
  monkeypatch.setattr(attention, "softmax_attention",
                      lambda *a: plain_calls.append(1) or softmax_attention(*a))
  m(tokens, hooks=plain)
  assert len(plain_calls) == 2
  m(tokens, hooks=read)
  assert len(plain_calls) == 3  # layer 0 only
  explicit = hooks.Hooks(capture=resids + [hooks.attn(l, "log_z") for l in range(2)])
  m(tokens, hooks=explicit)
  assert len(plain_calls) == 3
  for name in resids:
    np.testing.assert_allclose(plain.cache[name], explicit.cache[name], rtol=1e-5, atol=1e-5, err_msg=name)
