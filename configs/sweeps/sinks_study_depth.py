"""Depth for claim 3 of docs/results.md: 3 position schemes x 2 seeds = 6 eight-layer runs on the sinks recipe.

    python -m abspos_jax.sweep --sweep=configs/sweeps/sinks_study_depth.py --root=runs/sinks_study_L8 --launch=local

`configs/sweeps/sinks_study.py` (read its docstring for the recipe and the
overrides) at 8 layers: `model.position` over rope, ntk and swa (the claim
compares how the residual-stream component grows with depth in these three),
`train.seed` over 0 and 1. An 8-layer step costs about twice a 4-layer one.
"""

import os

from abspos_jax.config import load_config_file


def get_config():
  c = load_config_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "sinks_study.py"))
  c.vary = (
      ("model.position", ("rope", "ntk", "swa")),
      ("model.num_layers", (8,)),
      ("train.seed", (0, 1)),
  )
  c.slurm.time = "02:00:00"
  return c
