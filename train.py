r"""Train one model, or several seeds of one model together.

    python train.py --config=configs/rope.py --workdir=runs/rope \
        --config.model.num_layers=6 --config.train.steps=2000

Any config field can be overridden with ``--config.<field>=<value>``; unknown
fields and invalid values are refused before anything compiles. Rerunning the
same command resumes from the latest checkpoint in ``--workdir``.

Several seeds at once:

    python train.py --config=configs/tiny.py --workdir=runs/rope-s{seed} --seeds=0,1,2

trains the config with ``train.seed`` = 0, 1 and 2 in one jitted step
(``jax.vmap`` over stacked copies of params and optimizer state, each seed with
its own initialisation and data order) and writes the ordinary run directories
``runs/rope-s0``, ``runs/rope-s1`` and ``runs/rope-s2``: each is what
``--workdir=runs/rope-s1 --config.train.seed=1`` would write (losses equal to
~1e-6), and ``analyze.py`` reads it like any other run. ``--workdir`` must
contain the literal ``{seed}``. Each run logs its own losses; its
``tokens_per_s`` and ``mfu`` are the group's divided by the number of seeds.
Rerunning the same command resumes all of them.
"""

import logging
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from abspos_jax import config as config_lib

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py", "Config file (ml_collections).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: config, metrics, checkpoints. With --seeds, a "
                               "template holding the literal {seed}, e.g. runs/rope-s{seed}.", required=True)
_SEEDS = flags.DEFINE_list("seeds", None, "Comma-separated train.seed values to train together in one vmapped "
                           "step, one run directory each (e.g. 0,1,2). Absent: one run of config.train.seed.")


def parse_seeds(values: list[str]) -> list[int]:
  try:
    return [int(v) for v in values]
  except ValueError:
    raise config_lib.ConfigError(f"--seeds must be comma-separated integers, e.g. --seeds=0,1,2; got "
                                 f"{','.join(values)!r}") from None


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and tfds log every step at INFO
  log = logging.getLogger("abspos_jax")
  log.setLevel(logging.INFO)
  log.addHandler(logging.StreamHandler())
  log.propagate = False
  from abspos_jax.train_loop import train, train_seeds  # late: flags are parsed before jax starts
  try:
    if _SEEDS.value is None:
      train(_CONFIG.value, _WORKDIR.value)
    else:
      train_seeds(_CONFIG.value, _WORKDIR.value, parse_seeds(_SEEDS.value))
  except config_lib.ConfigError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
