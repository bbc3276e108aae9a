"""report.md, figures and the comparison table show the summary's intervals (``KEY_ci``) beside the numbers."""

import numpy as np

from abspos_jax.analysis import compare, figures, report

REASON = "null where the component before is not clearly non-zero"


def _entry(change, change_ci, removed, removed_ci):
  out = {}
  for comp in ("causal_mask", "residual_stream"):
    for suffix in ("", "_early"):
      out[f"{comp}_change{suffix}"], out[f"{comp}_change{suffix}_ci"] = change, change_ci
      out[f"{comp}_removed{suffix}"], out[f"{comp}_removed{suffix}_ci"] = removed, removed_ci
      if removed is None:
        out[f"{comp}_removed{suffix}_reason"] = REASON
  return out


def test_value_with_interval():
  assert report.with_interval(0.1234, [0.08, 0.16]) == "0.123 [0.080, 0.160]"
  assert report.with_interval(0.5, [None, None]) == "0.500 [n/a]"
  assert report.with_interval(None, None) == "n/a"
  assert report.with_interval(-2.5e-05, [-4e-05, -1e-05], fmt=report._g) == "-2.5e-05 [-4e-05, -1e-05]"
  assert report._layers_ci([0.1, 0.2], [[0.0, 0.2], [0.1, 0.3]]) == "0.10 [0.00, 0.20]; 0.20 [0.10, 0.30]"


def test_interventions_table_changes_fractions_reasons_and_skips():
  iv = {"bos_replace": {"skipped": "no BOS under main policy 'none'"},
        "pos0_patch": _entry(-0.002, [-0.003, -0.001], 0.25, [0.1, 0.4]),
        "sink_ablate": {**_entry(1e-5, [-1e-5, 3e-5], None, [None, None]), "heads": [[0, 1]], "heads_rule": "rule"}}
  lines = report._interventions(iv)
  rows = {l.split(" | ")[0][2:]: l for l in lines if l.startswith("| ") and "intervention" not in l}
  assert set(rows) == {"pos0_patch", "sink_ablate"}  # a skipped bos_replace has no row
  assert rows["pos0_patch"].count("-0.002 [-0.003, -0.001]; removed 0.250 [0.100, 0.400]") == 4
  assert rows["sink_ablate"].count("1e-05 [-1e-05, 3e-05]; removed n/a") == 4
  assert sum(REASON in l for l in lines) == 1  # the reason once, not per cell
  assert "bos_replace skipped: no BOS under main policy 'none'." in lines


def test_ci_errors_are_distances_to_the_bounds():
  err = figures.ci_errors([0.5, 1.0, np.nan], [[0.25, 1.0], None, [0.0, 1.0]])
  np.testing.assert_allclose(err, [[0.25, 0.0, 0.0], [0.5, 0.0, 0.0]])
  np.testing.assert_allclose(figures.ci_errors([0.5], None), [[0.0], [0.0]])


def test_comparison_shows_a_single_runs_interval():
  summary = {"components": {"pooled": {"residual_stream": 0.2, "residual_stream_ci": [0.1, 0.3]}}}
  path = ("components", "pooled", "residual_stream")
  assert compare._get_ci(summary, path) == [0.1, 0.3]
  assert compare._get_ci(summary, ("loss", "MAIN")) is None
  one = {"mean": 0.2, "std": None, "values": [0.2], "intervals": [[0.1, 0.3]]}
  assert compare._cell(one) == "0.200 [0.100, 0.300]"
  two = {"mean": 0.2, "std": 0.05, "values": [0.15, 0.25], "intervals": [[0.1, 0.2], [0.2, 0.3]]}
  assert compare._cell(two) == "0.200 ± 0.050"
