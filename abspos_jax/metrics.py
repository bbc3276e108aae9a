"""Metric logging: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard events.

Only process 0 writes. Records are appended and flushed one line at a time;
on resume the file is rewritten (temp file + rename) without the records past
the restored step and without a line a crash cut short, so it reads as one
uninterrupted run.
"""

import json
import os
import sys

import jax


class MetricsWriter:
  def __init__(self, workdir: str, resume_step: int | None = None):
    self.enabled = jax.process_index() == 0
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if not self.enabled:
      return
    if resume_step is not None and os.path.exists(self.path):
      kept = [json.dumps(r) + "\n" for r in read_metrics(workdir) if r["step"] <= resume_step]
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(kept)
      os.replace(tmp, self.path)
    elif resume_step is None and os.path.exists(self.path):
      os.remove(self.path)
    self._tb = _summary_writer_class()(os.path.join(workdir, "tensorboard"))
    self._file = open(self.path, "a")

  def write(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    for key, value in metrics.items():
      self._tb.add_scalar(key, float(value), int(step))

  def close(self) -> None:
    if self.enabled:
      self._file.close()
      self._tb.close()


def _summary_writer_class():
  """tensorboardX's ``SummaryWriter``, imported late (only the writing process needs it) and without torch.

  tensorboardX imports torch at module level whenever it is installed (the
  ``hf`` extra installs it) only to accept torch tensors, which costs 7-10 s
  at every ``train.py`` start. We log Python floats, so torch is hidden from
  that one import (``sys.modules[name] = None`` makes ``import name`` fail)
  unless something already loaded it.
  """
  if "tensorboardX" in sys.modules or "torch" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def read_metrics(workdir: str) -> list[dict]:
  """All complete records of ``workdir/metrics.jsonl`` in order.

  A line cut short by a crash mid-write is not a record and is skipped.
  """
  records = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except json.JSONDecodeError:
        continue
  return records
