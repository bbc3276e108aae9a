"""Metric logging: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard events.

Only process 0 writes. Records are appended and flushed one line at a time
(in an object store, which cannot append, the object is rewritten whole at
every record, one upload each); on resume the file is rewritten (temp file +
rename, or one upload) without the records past the restored step and without
a line a crash cut short, so it reads as one uninterrupted run.
"""

import json
import sys

import jax

from abspos_jax import storage


class MetricsWriter:
  """``provenance``: an entry (``abspos_jax.provenance.entry``) that the first record this writer writes carries
  under ``provenance`` (in metrics.jsonl only: TensorBoard takes scalars)."""

  def __init__(self, workdir: str, resume_step: int | None = None, provenance: dict | None = None):
    self.enabled = jax.process_index() == 0
    self.path = storage.join(workdir, "metrics.jsonl")
    self._provenance = provenance
    self._tb = None
    self._lines: list[str] = []  # an object store cannot append: the whole object is rewritten per record
    if not self.enabled:
      return
    exists = storage.path(self.path).exists()
    if resume_step is not None and exists:
      self._lines = [json.dumps(r) + "\n" for r in read_metrics(workdir) if r["step"] <= resume_step]
      storage.write_text(self.path, "".join(self._lines))
    elif resume_step is None and exists:
      storage.path(self.path).unlink()
    self._tb = _summary_writer_class()(storage.join(workdir, "tensorboard"))
    self._file = None if storage.is_remote(self.path) else open(self.path, "a")

  def write(self, step: int, metrics: dict[str, float]) -> None:
    if not self.enabled:
      return
    record = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
    if self._provenance is not None:
      record["provenance"], self._provenance = self._provenance, None
    line = json.dumps(record) + "\n"
    if self._file is None:
      self._lines.append(line)
      storage.write_text(self.path, "".join(self._lines))
    else:
      self._file.write(line)
      self._file.flush()
    for key, value in metrics.items():
      self._tb.add_scalar(key, float(value), int(step))

  def close(self) -> None:
    if self.enabled:
      if self._file is not None:
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
  for line in storage.read_text(storage.join(workdir, "metrics.jsonl")).splitlines():
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return records
