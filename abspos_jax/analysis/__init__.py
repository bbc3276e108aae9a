"""The analysis: where a trained decoder gets absolute position from.

Layout: ``options`` (every option, declared once), ``api`` (load a run or a
checkpoint, build its sequences, analyse, write), ``orchestrator``
(``analyze``: the passes, then each estimator's results), ``core`` (the core
estimators' results and jackknife, shared with the training-time
``emergence`` hook), and three subpackages: ``estimators`` (the statistics),
``passes`` (the jitted forward passes that feed them) and ``outputs``
(summary.json, stats.npz, report, figures, comparisons).

``analyze(model, sequences)`` runs the jitted pass and returns an
:class:`AnalysisResult`; ``analyze_run(workdir)`` does the same for a saved
run and writes ``summary.json``, ``stats.npz``, figures and ``report.md``;
``analyze_all_steps(workdir)`` for every kept checkpoint of a run, with the
components against the step (``docs/emergence.md``); ``analyze_hf(hf_dir)``
for a Hugging Face checkpoint (``docs/interop.md``); ``analyze_lengths`` for one
checkpoint at several context lengths (``docs/analysis.md``).
Add a statistic at any hook point with :class:`Statistic`.
"""

import importlib

# Imported on first use, so that importing one estimator module does not pull in TFDS and orbax (api).
_EXPORTS = {"AnalysisOptions": "options", "AnalysisResult": "orchestrator", "Statistic": "passes.steps",
            "analyze": "orchestrator", "analyze_all_steps": "api", "analyze_hf": "api", "analyze_lengths": "api",
            "analyze_run": "api"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name in _EXPORTS:
    return getattr(importlib.import_module(f"abspos_jax.analysis.{_EXPORTS[name]}"), name)
  raise AttributeError(f"module 'abspos_jax.analysis' has no attribute {name!r}")
