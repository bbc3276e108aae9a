"""The CPU demo: a 4-layer, d_model-128 RoPE model on the offline stdlib text.

Trains in a few minutes on 2 CPU cores (`make demo`).
"""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "rope"
  config.model.num_layers = 4
  config.model.d_model = 128
  config.model.num_heads = 4
  config.data.seq_len = 128
  config.train.batch_size = 32
  config.train.steps = 400
  config.train.warmup_steps = 50
  config.train.log_every = 20
  config.train.eval_every = 100
  config.checkpoint.every = 200
  return config
