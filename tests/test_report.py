"""report.md, figures and the comparison table show the summary's intervals (``KEY_ci``) beside the numbers."""

import numpy as np

from abspos_jax.analysis.outputs import compare, figures, report

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
  assert report._cell({"x": [0.1, 0.2], "x_ci": [[0.0, 0.2], [0.1, 0.3]]}, "x", 1) == "0.20 [0.10, 0.30]"
  assert report._cell({"x": [0.1]}, "x", 0) == "0.10 [n/a]" and report._cell({}, "x", 0) == "n/a"
  assert report._ranges([3, 4, 5, 9, 11, 12]) == "3-5, 9, 11-12"


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


def _per_layer(n: int, value: float) -> tuple[list, list]:
  return [value + 0.01 * i for i in range(n)], [[value - 0.1, value + 0.1]] * n


def deep_summary(num_layers: int = 30, num_heads: int = 9) -> dict:
  """A summary with every key report.md and the figures read, for a model of ``num_layers`` x ``num_heads``."""
  L, H = num_layers, num_heads
  s = {"num_layers": L, "num_heads": H, "position": "rope", "num_sequences": 8, "seq_len": 32, "main_policy": "prepend",
       "loss": {"prepend": 3.0, "none": 3.1}, "closedness_max_abs_diff": 0.0,
       "intervals": {"level": 0.95, "method": "jackknife", "nonempty_blocks": 8, "num_blocks": 16},
       "sink_heads": [[l, h] for l in range(3, L) for h in range(H - 1)], "sink_rate": [0.0] * 3 + [0.9] * (L - 3),
       "sink_score_max": 0.9, "sink_score_max_ci": [0.85, 0.95]}
  s["sink_score_max_layer"], s["sink_score_max_layer_ci"] = _per_layer(L, 0.5)
  c = {"pooled": {}, "pooled_early": {}}
  for key in ("causal_mask", "residual_stream", "causal_mask_early", "residual_stream_early"):
    c[key], c[key + "_ci"] = _per_layer(L, 0.5)
  for scope in ("pooled", "pooled_early"):
    for key in ("causal_mask", "residual_stream", "residual_stream_var"):
      c[scope][key], c[scope][key + "_ci"] = 0.5, [0.4, 0.6]
  s["components"] = c
  s["leakage"] = {"log_weights_overall": 0.01, "log_weights_overall_ci": [0.0, 0.02], "logits_overall": 0.01,
                  "logits_overall_ci": [0.0, 0.02]}
  s["leakage"]["log_weights_layer"], s["leakage"]["log_weights_layer_ci"] = _per_layer(L, 0.01)
  s["denominators"] = {}
  for key in ("log_z_slope_layer", "excess_mean_layer", "sink_mass_mean_layer"):
    s["denominators"][key], s["denominators"][key + "_ci"] = _per_layer(L, 0.3)
  s["probes"] = {}
  for key, n in (("residual_r2", L + 1), ("attention_r2", L)):
    s["probes"][key], s["probes"][key + "_ci"] = _per_layer(n, 0.7)
  s["position0"] = {"norm": [1.0] * (L + 1), "norm_ratio": [1.0] * 12 + [168.0] * (L - 11), "cos_prev": [0.9] * L}
  s["fingerprint"] = {"bos": [0.0] * (L + 1), "no_bos": [0.5] * (L + 1), "no_bos_num_groups": 40}
  return s


def test_a_30_layer_report_is_a_table_per_quantity():
  s = deep_summary()
  text = report.render(s, {"workdir": "smol", "options": {}}, ["log_z.png"])
  rows = [l for l in text.splitlines() if l.startswith("| ")]
  assert sum(l.startswith("| 29 |") for l in rows) == 2  # the denominators and the leakage tables
  assert sum(l.startswith("| after layer 29 |") for l in rows) == 1 and "| embedding |" in text
  assert max(len(l) for l in text.splitlines() if not l.startswith("|")) < 700  # no 30-value sentences
  assert "| 3 | " in text and "| 8/9 | " in text and "| 0/9 | " in text  # sink heads counted per layer
  assert "[3, 0]" not in text and "in layers 3-29" in text  # the 216 pairs stay in summary.json
  assert "0.510 [0.400, 0.600]" not in text and "0.51 [0.40, 0.60]" in text  # layer 1 of a per-layer list


def test_figures_of_a_deep_model_stay_legible(tmp_path):
  """32 layers x 16 heads: every figure a grid, none wider than 3,000 px."""
  from PIL import Image
  L, H, T = 32, 16, 24
  s = deep_summary(L, H)
  rng = np.random.default_rng(0)
  stats = {"log_z": rng.normal(size=(L, H, T)), "log_visible": np.log1p(np.arange(T)),
           "sink_score": rng.uniform(size=(L, H))}
  names = figures.all_figures(s, stats, str(tmp_path))
  assert {"log_z.png", "sink_mass.png", "components.png"} <= set(names)
  for name in names:
    width, height = Image.open(tmp_path / name).size
    assert width <= 3000 and height <= 3000, (name, width, height)
  assert Image.open(tmp_path / "log_z.png").size[1] > 1000  # rows of panels, not one strip
