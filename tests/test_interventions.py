"""Interventions: the edits (analysis/passes/edits.py) and their effects (analysis/estimators/effects.py) on models
with known answers."""

import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import model as model_lib
from abspos_jax.analysis import AnalysisOptions, analyze
from abspos_jax.analysis.passes import steps
from abspos_jax.data import BOS_ID
from conftest import small_config
from helpers import FAST, mask, sequences, zero_qk


def test_interventions_with_known_answers():
  """Replacing BOS by BOS's own embedding, or patching position 0 from another BOS input, changes nothing."""
  m, seqs = model_lib.create(small_config()), sequences()
  opts = AnalysisOptions(batch_size=6, progress=False, bos_replace_token=BOS_ID)
  iv = analyze(m, {"prepend": seqs["prepend"]}, options=opts).summary["interventions"]
  for entry in (iv["bos_replace"]["token"], iv["pos0_patch"]):
    for key in ("causal_mask_change", "residual_stream_change", "residual_stream_change_early"):
      assert abs(entry[key]) < 1e-6, (key, entry[key])
      lo, hi = entry[key + "_ci"]
      assert lo <= entry[key] <= hi
    for comp in ("causal_mask", "residual_stream"):
      removed, (lo, hi) = entry[f"{comp}_removed"], entry[f"{comp}_before_ci"]
      if removed is None:  # only where the component before is not clearly non-zero, and then with the reason
        assert entry[f"{comp}_removed_reason"]
      else:
        assert abs(removed) < 1e-4 and (lo > 0 or hi < 0), (comp, removed, lo, hi)
      if lo <= 0 <= hi:
        assert removed is None
  heads = iv["sink_ablate"]["heads"]
  assert [l for l, _ in heads] == [0, 1]  # no head reads the sink: the top head of each layer
  # Layer 0 sees only the embeddings: its other heads keep their sink mass, the ablated one has none.
  mass = analyze(m, {"prepend": seqs["prepend"]}, options=FAST).stats["sink_mass"][0][:, 4:].mean(-1)
  kept = np.delete(mass, heads[0][1])
  np.testing.assert_allclose(iv["sink_ablate"]["sink_mass_after"][0], kept.sum() / len(mass), rtol=1e-5)


def test_sink_ablate_on_a_flat_model_removes_no_residual_stream():
  """Zero query weights: no residual-stream component before, so none to remove (v1: 0.25 removed, = 1/H)."""
  iv = analyze(zero_qk(model_lib.create(small_config())), sequences(),
               options=AnalysisOptions(batch_size=6, progress=False)).summary["interventions"]
  sa = iv["sink_ablate"]
  for suffix in ("", "_early"):
    assert sa[f"residual_stream_removed{suffix}"] is None and "not clearly non-zero" in sa[
        f"residual_stream_removed{suffix}_reason"]
    assert abs(sa[f"residual_stream_change{suffix}"]) < 1e-6 and abs(sa[f"residual_stream_before{suffix}"]) < 1e-6


def test_bos_replace_needs_a_bos():
  m, seqs = model_lib.create(small_config()), sequences()
  iv = analyze(m, {"none": seqs["none"]}, main="none",
               options=AnalysisOptions(batch_size=6, progress=False)).summary["interventions"]
  assert set(iv["bos_replace"]) == {"skipped"} and "position 0 holds a text token" in iv["bos_replace"]["skipped"]
  assert "residual_stream_change" in iv["pos0_patch"] and "residual_stream_change" in iv["sink_ablate"]


@pytest.mark.parametrize("windows", [(None, None, None), (3, None, 3)])
def test_sink_designs_equal_the_designs_of_the_whole_cells(windows):
  """sink_ablate's per-head designs, assembled from each distinct layer mask's, equal make_design of the
  [L, H, T, T] cells (and of the cells over the model's keys), field by field, for one mask and for windowed
  layers beside global ones."""
  from abspos_jax.analysis.estimators import effects, fixed_effects
  from abspos_jax.analysis.passes import edits
  t = 12
  layers = [mask(t, w) for w in windows]
  visible = jnp.asarray(layers[0] if len(set(windows)) == 1 else np.stack(layers))
  heads = np.array([[True, False], [False, False], [True, True]])
  cells = edits.sink_cells(visible, heads)
  whole = (fixed_effects.make_design(cells), fixed_effects.make_design(cells, keys=fixed_effects.layer_mask(visible)))
  for got, want in zip(effects.sink_designs(visible, heads), whole):
    for name, a, b in zip(fixed_effects.FEDesign._fields, got, want):
      assert a.shape == b.shape and a.dtype == b.dtype, name
      np.testing.assert_array_equal(a, b, err_msg=name)


@pytest.mark.parametrize("position", ["rope", "swa", "learned"])
def test_pos0_patch_takes_the_source_stream_from_its_first_token_alone(position):
  """Position 0 sees only itself, so the source's position-0 stream at every depth is that of a one-token forward
  (to float32 rounding): pos0_patch runs one forward of the source's first token, not of its whole sequence."""
  m, src = model_lib.create(small_config(position)), jnp.asarray(sequences()["none"][:3])
  whole = steps.forward(m, src)["resid"][:, :, 0]
  first = steps.forward(m, src[:, :1])["resid"][:, :, 0]
  np.testing.assert_allclose(first, whole, rtol=1e-5, atol=1e-6)
