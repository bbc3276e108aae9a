"""Sliding-window attention (RoPE inside): `model.window` keys, the query included."""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "swa"
  return config
