"""The analysis: where a trained decoder gets absolute position from.

``analyze(model, sequences)`` runs the jitted pass and returns an
:class:`AnalysisResult`; ``analyze_run(workdir)`` does the same for a saved
run and writes ``summary.json``, ``stats.npz``, figures and ``report.md``;
``analyze_all_steps(workdir)`` for every kept checkpoint of a run, with the
components against the step (``docs/emergence.md``); ``analyze_hf(hf_dir)``
for a Hugging Face checkpoint (``docs/interop.md``).
Add a statistic at any hook point with :class:`Statistic`.
"""

from abspos_jax.analysis.analysis_pass import Statistic
from abspos_jax.analysis.api import analyze_all_steps, analyze_hf, analyze_run
from abspos_jax.analysis.run import AnalysisOptions, AnalysisResult, analyze

__all__ = ["AnalysisOptions", "AnalysisResult", "Statistic", "analyze", "analyze_all_steps", "analyze_hf",
           "analyze_run"]
