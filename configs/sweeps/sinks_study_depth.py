"""Depth for claim 3 of docs/results.md: 3 position schemes x 2 seeds = 6 eight-layer runs on the sinks recipe.

    python -m abspos_jax.sweep --sweep=configs/sweeps/sinks_study_depth.py --root=runs/sinks_study_L8 --launch=local

`configs/sweeps/sinks_study.py` (read its docstring for the recipe and the
overrides) at 8 layers: `model.position` over rope, ntk and swa (the claim
compares how the residual-stream component grows with depth in these three),
`train.seed` over 0 and 1. An 8-layer step costs about twice a 4-layer one.
"""

import ml_collections

from abspos_jax.sweep import sweep_defaults


def get_config():
  c = sweep_defaults()
  c.base = "configs/sinks_cpu.py"
  c.overrides = ml_collections.ConfigDict({
      "model": {"dtype": "bfloat16", "window": 64},
      "train": {"steps": 1500, "progress": False},
  })
  c.vary = (
      ("model.position", ("rope", "ntk", "swa")),
      ("model.num_layers", (8,)),
      ("train.seed", (0, 1)),
  )
  c.analyze.num_sequences = 256
  c.slurm.gpus_per_task = 0
  c.slurm.cpus_per_task = 2
  c.slurm.time = "02:00:00"
  return c
