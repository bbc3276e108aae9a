"""The paper's three architectures at single-GPU scale: 3 schemes x 2 depths x 3 seeds = 18 runs.

    python -m abspos_jax.sweep --sweep=configs/sweeps/paper_gpu.py --root=runs/paper_gpu --launch=slurm
    python -m abspos_jax.sweep --sweep=configs/sweeps/paper_gpu.py --root=runs/paper_gpu --launch=local

Varies `model.position` over rope, ntk and swa, `model.num_layers` over 4 and 8
and `train.seed` over 0, 1, 2, on top of `configs/base.py` (offline stdlib text,
byte-level, BOS prepended): d_model 512 with 8 heads (head dimension 64),
512-token sequences (sliding window of 128 keys), bfloat16 compute with
float32 parameters, 5000 steps x 64 sequences = 164M tokens per model (about
5.4 passes over the 30.2M training tokens of the stdlib text; 2.9B tokens for
the family), learning rate 1e-3 after 500 warmup steps. At
`6 N + 12 L T D` FLOPs per token that is 1.5e16 (4 layers, N = 13M) to 3.0e16
(8 layers, N = 26M) training FLOPs per model: a few minutes each on one modern
GPU at a realistic 20-40% MFU. Each run is analysed on 256 held-out sequences
per BOS policy. Measured on one H200 (`benchmarks.accelerator_mfu`,
docs/benchmarks.md): the bf16 step runs 1.99M tok/s (4 layers) and 0.99M
(8 layers), 18% of the datasheet peak, so a run's 164M tokens take 82 s and
165 s of step time; the sweep itself has not been run on a GPU.
"""

import ml_collections

from abspos_jax.sweep import sweep_defaults


def get_config():
  c = sweep_defaults()
  c.base = "configs/base.py"
  c.overrides = ml_collections.ConfigDict({
      "model": {"d_model": 512, "num_heads": 8, "window": 128, "dtype": "bfloat16"},
      "data": {"seq_len": 512},
      "train": {"steps": 5000, "batch_size": 64, "learning_rate": 1e-3, "warmup_steps": 500, "log_every": 50,
                "eval_every": 500, "progress": False},
      "checkpoint": {"every": 1000},
  })
  c.vary = (
      ("model.position", ("rope", "ntk", "swa")),
      ("model.num_layers", (4, 8)),
      ("train.seed", (0, 1, 2)),
  )
  c.analyze.num_sequences = 256
  c.slurm.gpus_per_task = 1
  c.slurm.cpus_per_task = 8
  c.slurm.time = "01:00:00"
  return c
