"""Family summaries (analyze.py --compare): per-layer and intervention results, mean ± std over seeds."""

import json

import numpy as np

from abspos_jax.analysis.outputs import family


def _summary(res_layers, early, removed_early, bos_fp, none_fp=None, change_early=-1e-3):
  return {"components": {"residual_stream": res_layers, "causal_mask": [1 - r for r in res_layers],
                         "residual_stream_early": early, "causal_mask_early": [None if r is None else 1 - r for r in early]},
          "sink_rate": [0.0] * len(res_layers), "position0": {"norm_ratio": [1.0] * (len(res_layers) + 1)},
          "fingerprint": {"bos": bos_fp, **({"no_bos": none_fp} if none_fp else {})},
          "denominators": {"log_z_slope_layer": [r + 0.3 for r in res_layers],
                           "excess_mean_layer": [-r for r in res_layers]},
          "interventions": {"bos_replace": {"mean": {"residual_stream_removed": 0.5,
                                                     "residual_stream_removed_early": removed_early,
                                                     "residual_stream_change": -2e-3,
                                                     "residual_stream_change_early": change_early}}}}


def test_means_and_seed_spread(tmp_path):
  groups = {
      "rope L2": [_summary([0.2, 0.4], [0.1, None], 0.3, [0.0, 0.0, 0.0], [0.9, 0.8, 0.7]),
                  _summary([0.4, 0.8], [0.3, None], 0.5, [0.0, 0.0, 0.0], [0.7, 0.6, 0.5], change_early=-3e-3)],
      "swa L1": [_summary([0.1], [0.2], None, [0.0, 0.0])],
  }
  table = family.write(groups, str(tmp_path))
  rope = table["rope L2"]
  assert rope["num_runs"] == 2
  np.testing.assert_allclose(rope["layers"]["residual_stream"]["mean"], [0.3, 0.6])
  np.testing.assert_allclose(rope["layers"]["residual_stream"]["std"], [np.sqrt(0.02), np.sqrt(0.08)])
  # 95% t-interval of a mean of 2 seeds: t_{1, 0.975} = 12.706 times sd / sqrt(2)
  np.testing.assert_allclose(rope["layers"]["residual_stream"]["ci_half"], 12.7062 * np.sqrt([0.01, 0.04]), rtol=1e-4)
  np.testing.assert_allclose(rope["layers"]["log_z_slope"]["mean"], [0.6, 0.9])
  np.testing.assert_allclose(rope["layers"]["causal_mask"]["mean"], [0.7, 0.4])
  assert rope["layers"]["residual_stream_early"]["mean"] == [0.2, None]  # no early queries: stays missing
  np.testing.assert_allclose(rope["layers"]["fingerprint_no_bos"]["mean"], [0.8, 0.7, 0.6])
  early = rope["interventions"]["bos_replace.mean"]["early"]
  np.testing.assert_allclose(early["mean"], [0.4])
  np.testing.assert_allclose(early["values"], [[0.3], [0.5]])
  change = rope["interventions"]["bos_replace.mean"]["change_early"]  # nats^2, defined even where a fraction is not
  np.testing.assert_allclose(change["mean"], [-2e-3])
  np.testing.assert_allclose(change["std"], [np.sqrt(2e-6)])
  np.testing.assert_allclose(rope["interventions"]["bos_replace.mean"]["change"]["values"], [[-2e-3], [-2e-3]])
  swa = table["swa L1"]
  assert swa["layers"]["residual_stream"]["std"] == [None] == swa["layers"]["residual_stream"]["ci_half"]  # one seed
  assert "fingerprint_no_bos" not in swa["layers"]
  assert swa["interventions"]["bos_replace.mean"]["early"]["mean"] == [None]  # removed fraction null: no mean
  np.testing.assert_allclose(swa["interventions"]["bos_replace.mean"]["change_early"]["mean"], [-1e-3])
  assert json.loads((tmp_path / "family.json").read_text()) == table
  for name in ("family_layers.png", "family_denominators.png", "family_interventions.png", "family_fingerprint.png"):
    assert (tmp_path / name).stat().st_size > 1000


def test_skipped_bos_replace_has_no_entry(tmp_path):
  """Under main policy "none" bos_replace is ``{"skipped": reason}``: no bos_replace kind is summarised."""
  runs = [_summary([0.2], [0.1], 0.3, [0.0, 0.0]) for _ in range(2)]
  for r in runs:
    r["interventions"] = {"bos_replace": {"skipped": "no BOS at position 0"},
                          "pos0_patch": {"residual_stream_removed": None, "residual_stream_removed_early": None,
                                         "residual_stream_change": 1e-4, "residual_stream_change_early": 3e-4}}
  table = family.write({"none": runs}, str(tmp_path))
  assert list(table["none"]["interventions"]) == ["pos0_patch"]
  np.testing.assert_allclose(table["none"]["interventions"]["pos0_patch"]["change_early"]["mean"], [3e-4])
  assert table["none"]["interventions"]["pos0_patch"]["early"]["mean"] == [None]
  for name in ("family_interventions.png",):
    assert (tmp_path / name).stat().st_size > 1000


def test_short_labels_drop_only_shared_settings():
  same = family.short_labels(["rope L2 d64 [data.name=backcopy]", "ntk L4 d64 [data.name=backcopy]"])
  assert same == {"rope L2 d64 [data.name=backcopy]": "rope L2 d64", "ntk L4 d64 [data.name=backcopy]": "ntk L4 d64"}
  differ = ["rope L2 d64 [train.steps=400]", "rope L2 d64 [train.steps=800]"]
  assert family.short_labels(differ) == {k: k for k in differ}
