"""The CPU study of docs/results.md: 4 position schemes x 2 depths x 3 seeds = 24 runs on the backcopy language.

    python -m abspos_jax.sweep --sweep=configs/sweeps/study_cpu.py --root=runs/study --launch=local

Varies `model.position` over rope, ntk, swa and the nope control,
`model.num_layers` over 2 and 4 and `train.seed` over 0, 1, 2 (one process
per run: on 2 CPU cores, vmapped seeds gained little, see README "Several seeds
at once"; set `seeds_together=True` on an accelerator). Every run: d_model 64
with 4 heads (head dimension 16), 128-token sequences with BOS prepended (the
sliding window is 32 keys), 400 steps x 32 sequences (1.6M tokens), learning
rate 3e-3 with weight decay 0.5, on the Bigram-Backcopy language
(`data.name=backcopy`, trigger probability 0.05, 8000 training documents): a
byte language in which attention is useful only right after a trigger, the
condition in which attention sinks form (docs/emergence.md). Each run is
analysed on 64 held-out sequences per BOS policy, interventions included.
Budget: about one hour on 2 CPU cores (docs/results.md gives the measured time).
"""

import ml_collections

from abspos_jax.sweep import sweep_defaults


def get_config():
  c = sweep_defaults()
  c.base = "configs/base.py"
  c.overrides = ml_collections.ConfigDict({
      "model": {"d_model": 64, "num_heads": 4, "window": 32},
      "data": {"name": "backcopy", "seq_len": 128, "backcopy_p_trigger": 0.05, "synthetic_docs": 8000},
      "train": {"steps": 400, "batch_size": 32, "warmup_steps": 40, "learning_rate": 3e-3, "weight_decay": 0.5,
                "log_every": 25, "eval_every": 100, "progress": False},
      "checkpoint": {"every": 200},
  })
  c.vary = (
      ("model.position", ("rope", "ntk", "swa", "nope")),
      ("model.num_layers", (2, 4)),
      ("train.seed", (0, 1, 2)),
  )
  c.seeds_together = False
  c.analyze.num_sequences = 64
  c.slurm.gpus_per_task = 0
  c.slurm.cpus_per_task = 2
  c.slurm.time = "00:30:00"
  return c
