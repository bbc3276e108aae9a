"""NTK-scaled RoPE, trained from scratch: base `rope_base * ntk_alpha ** (d_h / (d_h - 2))`."""

from abspos_jax.config import base_config


def get_config():
  config = base_config()
  config.model.position = "ntk"
  return config
