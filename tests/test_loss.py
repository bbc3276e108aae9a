"""The language-modelling loss (loss.py): made from the model's features a chunk of tokens at a time, it equals the
loss of the whole logits, and the analysis step then holds one chunk of logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from abspos_jax import model as model_lib, train_step
from abspos_jax.analysis.core import layer_visible
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.passes import steps
from abspos_jax.loss import chunked_lm_loss, lm_loss
from conftest import small_config
from helpers import sequences


@pytest.mark.parametrize("tie", [True, False])
def test_chunked_loss_equals_the_whole_loss(tie):
  """15 targets per sequence in chunks of 1, 4 (padded), 5 (dividing), 15 and 64 tokens (one chunk)."""
  m = model_lib.create(small_config(**{"model.tie_embeddings": tie}))
  toks = jnp.asarray(sequences()["prepend"][:3])
  targets = toks[:, 1:]
  want = lm_loss(m(toks[:, :-1]), targets)
  features = m.features(toks[:, :-1])
  for chunk in (1, 4, 5, 15, 64):
    got = jax.jit(lambda h, c=chunk: chunked_lm_loss(m.logits, h, targets, c))(features)
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"chunk {chunk}")


def _baseline_step(vocab: int, seq_len: int):
  m = model_lib.create(small_config(**{"model.vocab_size": vocab, "data.seq_len": seq_len}))
  graphdef, params = nnx.split(m, nnx.Param)
  design = fixed_effects.make_design(layer_visible(m.spec, seq_len))
  acc = steps.init_accumulators(m.spec, seq_len, {}, 4)
  return jax.jit(steps.make_baseline_step(graphdef, design, {})), params, acc


def test_the_analysis_step_holds_one_chunk_of_logits(monkeypatch):
  """A 16,384-token vocabulary at 128 tokens, 8 sequences: ``[8, 127, 16384]`` float32 logits are 64 MiB, the
  attention's ``[8, 4, 128, 128]`` 2 MiB. In chunks of 16 tokens the compiled step needs at least 3/4 of the logits
  less scratch, and its loss is the same."""
  toks = jnp.asarray(np.random.default_rng(0).integers(0, 16384, (8, 128)), jnp.int32)
  ids = jnp.arange(8) + 4  # past the closedness check: the loss's forward alone
  out = {}
  for chunk in (128, 16):
    monkeypatch.setattr(steps, "LOSS_CHUNK", chunk)
    step, params, acc = _baseline_step(16384, 128)
    scratch = step.lower(params, acc, toks, ids).compile().memory_analysis().temp_size_in_bytes
    got = step(params, acc, toks, ids)
    out[chunk] = scratch, float(got["loss_sum"] / got["loss_count"])
  whole_logits = 8 * 127 * 16384 * 4
  assert out[128][0] - out[16][0] > 0.75 * whole_logits, out
  np.testing.assert_allclose(out[16][1], out[128][1], rtol=1e-6)


def test_the_train_step_in_chunks_has_the_same_loss_and_gradients_and_holds_one_chunk():
  """``train.loss_chunk``: the training loss (``train_step.make_loss_fn``) in chunks of 16 tokens equals the
  whole-logits loss, and so do its gradients, within 1e-5 (float32). Under ``grad`` each chunk is recomputed
  in the backward: at a 16,384-token vocabulary, 4 sequences of 127 targets, the compiled gradient needs at
  least 3/4 of the ``[4, 127, 16384]`` float32 logits (32 MiB) less scratch."""
  m = model_lib.create(small_config(**{"model.vocab_size": 16384, "data.seq_len": 128, "model.tie_embeddings": False}))
  graphdef, params = nnx.split(m, nnx.Param)
  toks = jnp.asarray(np.random.default_rng(0).integers(0, 16384, (4, 128)), jnp.int32)
  out = {}
  for chunk in (0, 16):
    grad = jax.jit(jax.value_and_grad(train_step.make_loss_fn(graphdef, chunk)))
    scratch = grad.lower(params, toks).compile().memory_analysis().temp_size_in_bytes
    out[chunk] = scratch, grad(params, toks)
  (loss0, g0), (loss16, g16) = out[0][1], out[16][1]
  np.testing.assert_allclose(loss16, loss0, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  assert out[0][0] - out[16][0] > 0.75 * 4 * 127 * 16384 * 4, (out[0][0], out[16][0])
