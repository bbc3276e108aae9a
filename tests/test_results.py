"""docs/results.md's numbers still come back from its commands: one sinks-study row, in shortened form."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from abspos_jax.metrics import read_metrics
from conftest import default_level_env
from helpers import ROOT

DRIFT_TOL = 0.01  # nats; results.md rounds to 1e-4; other CPU kinds move a 100-step bf16 loss by ~1e-3


@pytest.mark.slow
def test_a_sinks_study_row_comes_back_in_shortened_form(tmp_path):
  """results.md names a sinks-study run's first steps (its own command with train.stop_at_step) and the
  losses they give; rerun, they must come back within DRIFT_TOL. The emergence hook is switched off here: it
  never changes training (tests/test_emergence.py checks bit-identical losses)."""
  with open(os.path.join(ROOT, "docs", "results.md")) as f:
    text = f.read()
  section = text[text.index("### Rerunning a row"):]
  command = re.search(r"`(python train\.py [^`]*--config\.train\.stop_at_step=(\d+))`", section)
  losses = re.search(r"training loss \*\*([\d.]+)\*\*, validation loss \*\*([\d.]+)\*\*", section)
  assert command and losses, "results.md's 'Rerunning a row' lost its command or its numbers"
  argv = [sys.executable if a == "python" else a.replace("WORKDIR", str(tmp_path / "row"))
          for a in shlex.split(command.group(1))] + ["--config.train.emergence=False"]
  r = subprocess.run(argv, cwd=ROOT, env=default_level_env(), capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  step = int(command.group(2))
  record = {m["step"]: m for m in read_metrics(tmp_path / "row")}[step]
  assert abs(record["loss"] - float(losses.group(1))) <= DRIFT_TOL, (record["loss"], losses.group(1))
  assert abs(record["val_loss"] - float(losses.group(2))) <= DRIFT_TOL, (record["val_loss"], losses.group(2))
