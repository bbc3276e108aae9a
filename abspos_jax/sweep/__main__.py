"""``python -m abspos_jax.sweep``: see :mod:`abspos_jax.sweep`."""

from abspos_jax.sweep.cli import main

main()
