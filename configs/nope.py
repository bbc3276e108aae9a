"""`model.position = "nope"` on top of `configs/base.py`."""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "nope"
  return config
