"""A CPU-budget recipe in which attention sinks form (issue 9, docs/emergence.md).

`configs/tiny.py`'s model (4 layers, d_model 128, RoPE) on the offline stdlib
text, with the levers of
DESIGN.md section 3b: BOS prepended to every sequence, seq_len 256, a high
learning rate (1e-2) and weight decay 0.5. 3,000 steps of 16 x 256 tokens
(12.3M tokens, about half an hour on 2 idle CPU cores). The emergence hook runs
every 100 steps; every checkpoint (every 250 steps: before, while and after the
sinks form) is kept for `analyze.py --all_steps`.
"""

import os

from abspos_jax.config import load_config_file


def get_config():
  config = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny.py"))  # its model
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
