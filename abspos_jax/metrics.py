"""Metric logging: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard events.

Only process 0 writes. Records are appended and flushed one line at a time;
on resume the file is rewritten (temp file + rename) without the records past
the restored step and without a line a crash cut short, so it reads as one
uninterrupted run.
"""

import json
import os

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
    from tensorboardX import SummaryWriter  # late: only the writing process needs it
    self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
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
