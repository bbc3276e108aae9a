"""The paper's model family at CPU scale: 5 position schemes x 3 depths x 3 seeds = 45 runs.

    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=local

Varies `model.position` over rope, ntk, swa and the nope and learned controls,
`model.num_layers` over 2, 4, 8 and `train.seed` over 0, 1, 2, on top of
`configs/base.py` (offline stdlib text, byte-level, BOS prepended) with these
CPU-friendly overrides: d_model 64 with 4 heads (head dimension 16), 64-token
sequences (the sliding window `model.window` is 16 keys), 300 steps x 16
sequences (307k tokens per run, 30 warmup steps), checkpoints at steps 100, 200
and 300, no progress bar (output goes to each run's train.log). Each run is
analysed on 64 held-out sequences per BOS policy. Measured here for rope-L4-s0
(2 shared CPU cores): 137 s user + 12 s system CPU time for training and
analysis together (validation loss 2.09 nats/byte at step 300); 45 such runs
are about 1.9 CPU-hours (2-layer runs cost less, 8-layer more). This is a smoke-scale family
(the sinks the paper reads need far more tokens, see DESIGN.md "Sinks need
budget"); raise the budget from the command line, e.g.
`--sweep.overrides.train.steps=1200`.
"""

import ml_collections

from abspos_jax.sweep import sweep_defaults


def get_config():
  c = sweep_defaults()
  c.base = "configs/base.py"
  c.overrides = ml_collections.ConfigDict({
      "model": {"d_model": 64, "num_heads": 4, "window": 16},
      "data": {"seq_len": 64},
      "train": {"steps": 300, "batch_size": 16, "warmup_steps": 30, "log_every": 25, "eval_every": 100,
                "progress": False},
      "checkpoint": {"every": 100},
  })
  c.vary = (
      ("model.position", ("rope", "ntk", "swa", "nope", "learned")),
      ("model.num_layers", (2, 4, 8)),
      ("train.seed", (0, 1, 2)),
  )
  c.analyze.num_sequences = 64
  c.slurm.gpus_per_task = 0
  c.slurm.cpus_per_task = 2
  c.slurm.time = "00:30:00"
  return c
