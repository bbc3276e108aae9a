r"""Train one model.

    python train.py --config=configs/rope.py --workdir=runs/rope \
        --config.model.num_layers=6 --config.train.steps=2000

Any config field can be overridden with ``--config.<field>=<value>``; unknown
fields and invalid values are refused before anything compiles. Rerunning the
same command resumes from the latest checkpoint in ``--workdir``.
"""

import logging
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from abspos_jax import config as config_lib

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py", "Config file (ml_collections).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: config, metrics, checkpoints.", required=True)


def main(argv):
  del argv
  absl_logging.set_verbosity(absl_logging.WARNING)  # orbax and tfds log every step at INFO
  log = logging.getLogger("abspos_jax")
  log.setLevel(logging.INFO)
  log.addHandler(logging.StreamHandler())
  log.propagate = False
  from abspos_jax.train_loop import train  # late: flags are parsed before jax starts
  try:
    train(_CONFIG.value, _WORKDIR.value)
  except config_lib.ConfigError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
