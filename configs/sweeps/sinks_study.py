"""The sinks study of docs/results.md: 4 position schemes x 3 seeds = 12 four-layer runs on the sinks recipe.

    python -m abspos_jax.sweep --sweep=configs/sweeps/sinks_study.py --root=runs/sinks_study --launch=local

On top of `configs/sinks_cpu.py` (stdlib text, seq_len 256, BOS prepended,
learning rate 1e-2 with weight decay 0.5, 16 x 256 tokens per step, the
emergence hook every 100 steps, every 250-step checkpoint kept for
`analyze.py --all_steps`), varies `model.position` over rope, ntk, swa and the
nope control and `train.seed` over 0, 1, 2. Overrides, and why:

- 1,500 steps (6.1M tokens), not 3,000: in the 3,000-step runs of
  docs/emergence.md the layer-0 sinks were in place by step 1,000-1,500, and in
  the 1,500-step validation runs (docs/emergence.md, "bfloat16 against
  float32") 3 of 4 layer-0 heads were sinks by step 900, so the schedule
  covers before, while and after sinks form.
- `model.dtype="bfloat16"` (f32 parameters and accumulation): the validation
  pair above tracked float32 within 0.03 nats of validation loss at every
  evaluation, with the same sink rate from step 900 on, at 1.5x the tokens/s.
- `model.window=64`: the sliding window sees a quarter of the 256-token
  sequence (the base config's 32 is an eighth), the issue's first candidate
  for an SWA model that still forms sinks.

Each run is analysed on 256 held-out sequences per BOS policy, interventions
included. Budget (2 CPU cores, measured for seed 0 while other work shared
the cores): 9.5-12.5 minutes of training (8.5 for the bf16 validation run
alone) and 1.7-2.6 minutes of analysis per run; run it a seed at a time with
`--only=-s0`, `--only=-s1`, ... (the sweep skips what is done and resumes what
was cut).
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
      ("model.position", ("rope", "ntk", "swa", "nope")),
      ("model.num_layers", (4,)),
      ("train.seed", (0, 1, 2)),
  )
  c.analyze.num_sequences = 256
  c.slurm.gpus_per_task = 0
  c.slurm.cpus_per_task = 2
  c.slurm.time = "01:00:00"
  return c
