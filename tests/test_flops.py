"""FLOP counts (flops.py): what the MFU of training divides by."""

from abspos_jax import flops
from abspos_jax import model as model_lib
from conftest import small_config


def test_mfu_counts_the_attention_over_all_keys_or_the_visible_ones():
  """``6 N + 12 L T D`` over all keys; ``causal_half``: ``T / 2`` keys per causal layer (MaxText) and
  ``W - W^2 / (2 T)`` per windowed layer, so a window of ``T`` keys counts as causal."""
  spec = model_lib.ModelSpec.from_config(small_config(**{"data.seq_len": 64}))
  n, d, layers = flops.matmul_params(spec), spec.d_model, spec.num_layers
  assert flops.train_flops_per_token(spec, 64) == 6 * n + 12 * layers * 64 * d
  assert flops.train_flops_per_token(spec, 64, causal_half=True) == 6 * n + 6 * layers * 64 * d
  swa = model_lib.ModelSpec.from_config(small_config("swa", **{"model.window": 16, "model.layer_pattern": "LG"}))
  assert flops.train_flops_per_token(swa, 64, causal_half=True) == 6 * n + 12 * (16 - 16 * 16 / 128 + 32) * d
  full = model_lib.ModelSpec.from_config(small_config("swa", **{"model.window": 64}))
  assert flops.train_flops_per_token(full, 64, causal_half=True) == flops.train_flops_per_token(spec, 64, True)
