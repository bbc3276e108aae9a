"""Analysis options (abspos_jax/analysis/options.py): declared once, they make analyze.py's flags, the sweep's
analyze.* keys and the docs table."""

import os

from absl import flags as absl_flags

from abspos_jax.analysis import options
from abspos_jax.sweep import spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_flags_sweep_keys_and_docs_come_from_the_declarations():
  fv = absl_flags.FlagValues()
  holders = options.define_flags(fv)
  fv(["analyze.py", "--num_sequences=8", "--main_policy=none", "--hf_ignore_fields=a,b", "--window=4"])
  assert [holders[n].value for n in ("num_sequences", "main_policy", "hf_ignore_fields", "window", "split")] == [
      8, "none", ["a", "b"], 4, "validation"]
  assert set(holders) == {f.name for f in options.FLAGS}
  assert spec.ANALYZE_FLAGS == options.sweep_keys() and "bos" not in spec.ANALYZE_FLAGS
  defaults = spec.sweep_defaults().analyze
  assert (defaults.enabled, defaults.num_sequences, defaults.skip_interventions, defaults.seq_len) == (True, 256,
                                                                                                        False, None)
  with open(os.path.join(ROOT, "docs", "analysis.md")) as f:
    assert f"{options.DOCS_BEGIN}\n{options.markdown()}\n{options.DOCS_END}" in f.read(), (
        "docs/analysis.md's flag table is stale: run python -m abspos_jax.analysis.options")
