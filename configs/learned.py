"""`model.position = "learned"` on top of `configs/base.py`."""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "learned"
  return config
