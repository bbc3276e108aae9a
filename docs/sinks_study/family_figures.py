"""The sinks study's family numbers and figures, redrawn from the summaries committed beside this file.

    python docs/sinks_study/family_figures.py

For each of ``comparison.json`` (4 layers) and ``comparison_L8.json`` (8
layers) it groups the committed ``RUN.summary.json`` files as ``analyze.py
--compare`` grouped the runs, and writes through ``abspos_jax.analysis.outputs.family``
(what ``--compare`` calls): ``family.json`` / ``family_L8.json`` here and
``docs/figures/sinks_study{,_L8}_family_{layers,denominators,interventions,fingerprint}.png``,
bands and error bars being 95% t-intervals over seeds.
"""

import json
import os
import shutil
import tempfile

from abspos_jax.analysis.outputs import family

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = os.path.join(os.path.dirname(HERE), "figures")
STUDIES = (("comparison.json", "family.json", "sinks_study"), ("comparison_L8.json", "family_L8.json", "sinks_study_L8"))


def groups(comparison: str) -> dict[str, list[dict]]:
  """``{group label: [summary.json of each run]}`` for the runs ``comparison`` lists."""
  with open(os.path.join(HERE, comparison)) as f:
    table = json.load(f)
  out = {}
  for label, row in table.items():
    out[label] = []
    for run_dir in row["runs"]:
      with open(os.path.join(HERE, f"{os.path.basename(run_dir)}.summary.json")) as f:
        out[label].append(json.load(f))
  return out


def main() -> None:
  for comparison, family_json, prefix in STUDIES:
    with tempfile.TemporaryDirectory() as tmp:
      family.write(groups(comparison), tmp)
      shutil.copy(os.path.join(tmp, "family.json"), os.path.join(HERE, family_json))
      for name in sorted(os.listdir(tmp)):
        if name.endswith(".png"):
          shutil.copy(os.path.join(tmp, name), os.path.join(FIGURES, f"{prefix}_{name}"))
          print(f"wrote docs/figures/{prefix}_{name}")


if __name__ == "__main__":
  main()
