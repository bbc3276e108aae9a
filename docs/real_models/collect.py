"""Copy each finished run of docs/real_models/study.sh (runs/real/<name>/) into docs/real_models/<name>/: its
summary.json and report.md, and the figures docs/real_models.md shows.

    python docs/real_models/collect.py [RUNS_DIR]   # default runs/real
"""

import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = ("log_z.png", "sink_mass.png", "components.png", "position0.png", "interventions.png")


def main() -> None:
  runs = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "runs", "real")
  for name in sorted(os.listdir(runs)):
    src = os.path.join(runs, name)
    if "." in name or not os.path.exists(os.path.join(src, "report.md")):  # unfinished, a kept copy, or not a run
      continue
    dst = os.path.join(HERE, name)
    os.makedirs(dst, exist_ok=True)
    for f in ("summary.json", "report.md", *FIGURES):
      if os.path.exists(os.path.join(src, f)):
        shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    print("collected", name)


if __name__ == "__main__":
  main()
