r"""Sweeps: a family of runs (a base config x the Cartesian product of varied fields) from one file.

    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=local
    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=print
    python -m abspos_jax.sweep --sweep=configs/sweeps/paper.py --root=runs/paper --launch=slurm \
        [--dry_run] [--only=rope-L2] [--sweep.overrides.train.steps=600]

A sweep file is an ml_collections Python file whose ``get_config()`` returns
(usually starting from :func:`sweep_defaults`):

- ``base``: a config file relative to the repository root, e.g. ``"configs/base.py"``;
- ``overrides``: fields set in every run, nested like ``configs/base.py``
  (``{"train": {"steps": 300}}`` sets ``train.steps``);
- ``vary``: ``((field, (values...)), ...)``; the runs are the Cartesian product,
  the first field outermost (a field also in ``overrides`` takes its values from here);
- ``analyze``: ``enabled`` and the ``analyze.py`` flags of each run
  (``num_sequences``, ``skip_interventions``, ``batch_size``, ``memory_budget_gb``, ``split``, ``seq_len``);
- ``seeds_together``: train the runs that differ only in ``train.seed`` as one
  ``train.py --seeds=...`` command;
- ``slurm``: the options of ``--launch=slurm``.

Everything is checked before anything runs: every field must exist in
``configs/base.py`` and every run's config must pass ``config.validate``.
Run ``k`` of the product works in ``ROOT/<name>``, the name built from the
varied values only (``rope-L2-s0``, see :func:`run_name`).

Modules: ``spec`` (the sweep file's fields, checks, expansion and run names),
``commands`` (the command lines, ``commands.sh``, the slurm script),
``state`` (what a run directory holds and what to do with it), ``local``
(``--launch=local``: run, skip, resume, analyse, compare), ``cli`` (the command).
"""

from abspos_jax.sweep.cli import LAUNCHES, execute, main
from abspos_jax.sweep.commands import Job, commands_text, jobs, sbatch_text, select, sweep_json
from abspos_jax.sweep.local import local_env, run_local, run_logged
from abspos_jax.sweep.spec import REPO, SEED_FIELD, Run, Sweep, SweepError, expand, name_part, run_name, sweep_defaults
from abspos_jax.analysis.outputs.schema import ESTIMATORS
from abspos_jax.sweep.state import Decision, RunState, analysed_step, decide, latest_checkpoint_step, read_state

__all__ = ["ESTIMATORS", "LAUNCHES", "REPO", "SEED_FIELD", "Decision", "Job", "Run", "RunState", "Sweep", "SweepError",
           "analysed_step", "commands_text", "decide", "execute", "expand", "jobs", "latest_checkpoint_step",
           "local_env", "main", "name_part", "read_state", "run_local", "run_logged", "run_name", "sbatch_text",
           "select", "sweep_defaults", "sweep_json"]
