"""A CPU-budget recipe in which attention sinks form (issue 9, docs/emergence.md).

A 4-layer, d_model-128 RoPE model on the offline stdlib text, with the levers of
DESIGN.md section 3b: BOS prepended to every sequence, seq_len 256, a high
learning rate (1e-2) and weight decay 0.5. 3,000 steps of 16 x 256 tokens
(12.3M tokens, about half an hour on 2 idle CPU cores). The emergence hook runs
every 100 steps; every checkpoint (every 250 steps: before, while and after the
sinks form) is kept for `analyze.py --all_steps`.
"""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "rope"
  config.model.num_layers = 4
  config.model.d_model = 128
  config.model.num_heads = 4
  config.data.name = "stdlib_text"
  config.data.bos = "prepend"
  config.data.seq_len = 256
  config.train.batch_size = 16
  config.train.steps = 3000
  config.train.warmup_steps = 100
  config.train.learning_rate = 1e-2
  config.train.weight_decay = 0.5
  config.train.log_every = 25
  config.train.eval_every = 100
  config.checkpoint.every = 250
  config.checkpoint.keep_period = 250
  return config
