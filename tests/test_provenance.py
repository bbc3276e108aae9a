"""Provenance (abspos_jax/provenance.py): every run and analysis names its code, versions, machine, command, time;
comparisons flag runs made by different code; resuming with other code is recorded."""

import json
import logging

import pytest

from abspos_jax import provenance
from abspos_jax.analysis import AnalysisOptions, analyze_run
from abspos_jax.analysis.outputs.compare import compare
from abspos_jax.metrics import read_metrics
from abspos_jax.train_loop import train
from conftest import small_config


FAST = AnalysisOptions(interventions=False, progress=False, batch_size=8)
OTHER = {"git_commit": "0123456789abcdef", "git_dirty": False, "package_version": "0.0.1"}


def test_an_entry_names_code_versions_machine_command_and_time():
  e = provenance.entry("analysis")
  assert e["code"]["package_version"] and e["code"]["git_commit"]  # tests run from a checkout (CI: a fresh clone)
  assert provenance.code_id(e).startswith("git:") and len(provenance.code_id(e)) >= 14
  assert {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint"} <= set(e["versions"]) and all(e["versions"].values())
  assert e["machine"]["backend"] == "cpu" and e["machine"]["device_count"] >= 1 and e["machine"]["process_count"] == 1
  assert e["command"] and e["time"].endswith("+00:00")
  assert provenance.code_id({"package_version": "1.2"}) == "abspos_jax 1.2"
  assert provenance.code_id({**OTHER, "git_dirty": True}) == "git:0123456789+dirty"
  assert provenance.code_id(None) == provenance.UNKNOWN


class _Capture(logging.Handler):
  def __init__(self):
    super().__init__(logging.WARNING)
    self.lines = []

  def emit(self, record):
    self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two runs: ``a`` trained in one go; ``b`` stopped at step 2 and resumed with (pretended) other code.

  The resume happens here, not in a test, so that every test of the module sees the mixed run under any
  test order or xdist split. Returns the root and the warnings the resume logged."""
  root = tmp_path_factory.mktemp("prov")
  train(small_config(), str(root / "a"))
  train(small_config(**{"train.stop_at_step": 2, "train.seed": 1}), str(root / "b"))
  log, capture = logging.getLogger("abspos_jax"), _Capture()
  log.addHandler(capture)
  try:
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(provenance, "code", lambda: OTHER)
      train(small_config(**{"train.seed": 1}), str(root / "b"))
  finally:
    log.removeHandler(capture)
  return root, "\n".join(capture.lines)


def test_a_run_records_each_start_and_resume(runs):
  root, resume_log = runs
  a = json.loads((root / "a" / provenance.FILE).read_text())
  assert [(e["event"], e["step"]) for e in a] == [("train", 0)]
  first = read_metrics(root / "a")[0]
  assert first["provenance"]["code"] == a[0]["code"] and "provenance" not in read_metrics(root / "a")[1]
  b = json.loads((root / "b" / provenance.FILE).read_text())
  assert [(e["event"], e["step"]) for e in b] == [("train", 0), ("resume", 2)]
  assert b[1]["code"] == OTHER and b[0]["code"] != OTHER
  assert "from step 2 with different code: trained so far by git:" in resume_log and "now git:0123456789" in resume_log
  records = read_metrics(root / "b")
  assert [m["step"] for m in records if "provenance" in m] == [1, 3]  # each session's first record


def test_analysis_and_comparison_name_the_code(runs, tmp_path):
  runs, _ = runs
  r = analyze_run(str(runs / "a"), num_sequences=4, options=FAST)
  analyze_run(str(runs / "b"), num_sequences=4, options=FAST)
  meta = json.loads((runs / "a" / "analysis" / "summary.json").read_text())["meta"]
  assert meta["provenance"]["analysis"]["event"] == "analysis" and len(meta["provenance"]["training"]) == 1
  report = (runs / "a" / "analysis" / "report.md").read_text()
  assert f"analysed by {provenance.code_id(meta['provenance']['analysis'])}" in report and "trained by git:" in report
  assert r.summary is not None
  compare([str(runs / "a"), str(runs / "b")], str(tmp_path / "cmp"))
  md = (tmp_path / "cmp" / "comparison.md").read_text()
  assert md.splitlines()[2].startswith("**Warning: the runs were trained by different code versions: ")
  assert "git:0123456789: " + str(runs / "b") in md and "analysed by different" not in md
  table = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
  codes = next(iter(table.values()))["code"]
  assert codes[str(runs / "b")]["trained"] == sorted({provenance.code_id(provenance.code()), "git:0123456789"})
  compare([str(runs / "a")], str(tmp_path / "one"))
  assert "Warning" not in (tmp_path / "one" / "comparison.md").read_text()


def test_summaries_without_provenance_count_as_unknown():
  assert provenance.codes({}) == {"trained": {provenance.UNKNOWN}, "analysed": {provenance.UNKNOWN}}
  current = {"provenance": provenance.analysis()}  # an imported checkpoint: no training entries
  assert provenance.codes(current)["trained"] == set()
  assert provenance.mixed({"x": {}, "y": current}) == [
      f"the runs were analysed by different code versions: {provenance.code_id(provenance.code())}: y; "
      f"{provenance.UNKNOWN}: x"]
