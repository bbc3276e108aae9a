"""Sweeps: expansion, names, validation, print / slurm output, skip-and-resume decisions, seed groups. A real
sweep (train, analyse, compare, skip, resume, in subprocesses) runs end to end into a bucket in test_storage."""

import json
import os
import re
import shlex
import subprocess
import sys

import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from abspos_jax import config as config_lib
from abspos_jax import sweep as sweep_lib
from abspos_jax.sweep import Decision, RunState, SweepError
from conftest import SMALL
from helpers import sweep_cfg


REPO = sweep_lib.REPO
FAMILY = (("model.position", ("rope", "ntk")), ("model.num_layers", (2, 4)), ("train.seed", (0, 1)))


# ---------------------------------------------------------------------------- expansion and names


def test_expansion_is_the_product_first_field_outermost():
  s = sweep_lib.expand(sweep_cfg(FAMILY))
  assert [r.name for r in s.runs] == ["rope-L2-s0", "rope-L2-s1", "rope-L4-s0", "rope-L4-s1",
                                      "ntk-L2-s0", "ntk-L2-s1", "ntk-L4-s0", "ntk-L4-s1"]
  assert s.runs[5].varied == {"model.position": "ntk", "model.num_layers": 2, "train.seed": 1}
  for r in s.runs:
    c = r.config
    assert (c.model.position, c.model.num_layers, c.train.seed) == tuple(r.varied.values())
    assert (c.model.d_model, c.train.steps, c.data.name) == (32, 4, "synthetic")  # the fixed overrides
    assert c.train.learning_rate == config_lib.base_config().train.learning_rate  # untouched: the base
  assert s.overrides["train.steps"] == 4 and s.overrides["model.window"] == 4
  assert "model.num_layers" not in s.overrides  # fixed in SMALL, varied here: vary wins


def test_nothing_varied_is_one_run_named_run():
  s = sweep_lib.expand(sweep_cfg(()))
  assert [r.name for r in s.runs] == ["run"]


@pytest.mark.parametrize("field, value, name", [
    ("model.position", "swa", "swa"),
    ("model.num_layers", 8, "L8"),
    ("train.seed", 12, "s12"),
    ("model.d_model", 64, "d64"),
    ("data.seq_len", 256, "T256"),
    ("train.learning_rate", 3e-3, "lr3e-3"),
    ("train.learning_rate", 1e-4, "lr1e-4"),
    ("train.learning_rate", 0.5, "lr0.5"),
    ("train.weight_decay", 0.1, "wd0.1"),
    ("model.window", 32, "W32"),
    ("model.num_heads", 8, "H8"),
    ("model.rope_base", 10000.0, "rope_base=1e4"),
    ("model.rope_base", 500000.0, "rope_base=5e5"),
    ("model.ntk_alpha", 2.5, "ntk_alpha=2.5"),
    ("model.tie_embeddings", False, "tie_embeddings=false"),
    ("mesh.shape", (2, 4), "shape=2x4"),
    ("data.files", "corpus/*.txt", "files=corpus__.txt"),
    ("data.bos", "none", "bos=none"),
])
def test_name_parts(field, value, name):
  assert sweep_lib.name_part(field, value) == name


def test_names_are_readable_and_stable_across_expansions():
  vary = (("model.position", ("swa",)), ("model.window", (8, 16)), ("train.learning_rate", (1e-3,)),
          ("data.bos", ("prepend", "none")))
  names = [r.name for r in sweep_lib.expand(sweep_cfg(vary)).runs]
  assert names == ["swa-W8-lr1e-3-bos=prepend", "swa-W8-lr1e-3-bos=none",
                   "swa-W16-lr1e-3-bos=prepend", "swa-W16-lr1e-3-bos=none"]
  assert [r.name for r in sweep_lib.expand(sweep_cfg(vary)).runs] == names
  assert all(re.fullmatch(r"[A-Za-z0-9._+=-]+", n) for n in names)


@pytest.mark.parametrize("vary", [
    (("train.seed", (0, 0)),),
    (("data.name", ("a/b", "a_b")),),
    (("model.rope_base", (10000.0, 1e4)),),
])
def test_colliding_names_are_refused(vary):
  with pytest.raises(SweepError, match=r"sweep\.vary: runs .* both get the name"):
    sweep_lib.expand(sweep_cfg(vary))


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("change, match", [
    (dict(vary=(("model.dmodel", (32,)),)), r"sweep\.vary\[0\]: 'model\.dmodel' is not a config field; did you mean "
                                            r"model\.d_model"),
    (dict(overrides={"train": {"stepz": 3}}), r"sweep\.overrides: 'train\.stepz' is not a config field"),
    (dict(vary=(("model.num_layers", ("two",)),)), r"sweep\.vary model\.num_layers: model\.num_layers='two' does "
                                                   r"not fit"),
    (dict(vary=(("model.num_heads", (4, 3)),)), r"run H3 \(from sweep\.vary model\.num_heads=3, sweep\.overrides "
                                                r"model\.d_model=32\): config\.model\.num_heads must divide"),
    (dict(overrides={"model": {"d_model": 30}}), r"run rope \(from sweep\.overrides model\.d_model=30\): "
                                                 r"config\.model\.num_heads must divide"),
    (dict(vary=(("model.position", ("rope", "alibi")),)), r"run alibi \(from sweep\.vary model\.position='alibi'\): "
                                                          r"config\.model\.position must be one of"),
    (dict(vary=(("train.seed", (0,)), ("train.seed", (1,)))), r"sweep\.vary\[1\]: train\.seed is varied twice"),
    (dict(vary=(("train.seed", ()),)), r"sweep\.vary\[0\]: train\.seed has no values"),
    (dict(vary=("train.seed",)), r"sweep\.vary\[0\] must be a \(field, \(values\.\.\.\)\) pair"),
    (dict(base="configs/nothere.py"), r"sweep\.base: 'configs/nothere\.py' is not a config file"),
])
def test_invalid_sweeps_are_refused_naming_the_field(change, match):
  base = change.pop("base", None)
  c = sweep_cfg(change.pop("vary", (("model.position", ("rope",)),)), change.pop("overrides", None))
  if base:
    c.base = base
  with pytest.raises(SweepError, match=match):
    sweep_lib.expand(c)


def test_unknown_sweep_fields_are_refused():
  c = sweep_cfg(())
  c.analyse = ml_collections.ConfigDict({"enabled": False})
  with pytest.raises(SweepError, match=r"sweep\.analyse is not a sweep field; allowed: base, overrides"):
    sweep_lib.expand(c)
  c = sweep_cfg(())
  c.analyze.step = 3
  with pytest.raises(SweepError, match=r"sweep\.analyze\.step is not a sweep field; allowed: enabled, num_sequences"):
    sweep_lib.expand(c)
  c = sweep_cfg(())
  c.analyze = ml_collections.ConfigDict({"num_sequences": "64"})  # a file that builds its own
  with pytest.raises(SweepError, match=r"sweep\.analyze\.num_sequences='64' has the wrong type"):
    sweep_lib.expand(c)
  c = sweep_cfg(())
  c.slurm.gpus = 2
  with pytest.raises(SweepError, match=r"sweep\.slurm\.gpus is not a sweep field"):
    sweep_lib.expand(c)


def test_a_fixed_mesh_is_validated_against_its_own_device_count():
  c = sweep_cfg((), dict(SMALL, mesh={"shape": (2, 2), "axes": ("data", "fsdp")}))
  assert sweep_lib.expand(c).runs[0].config.mesh.shape == (2, 2)


@pytest.mark.parametrize("name", ["paper", "paper_gpu"])
def test_shipped_sweeps_are_valid(name):
  s = sweep_lib.expand(config_lib.load_config_file(f"configs/sweeps/{name}.py"))
  positions = {"paper": ["rope", "ntk", "swa", "nope", "learned"], "paper_gpu": ["rope", "ntk", "swa"]}[name]
  layers = {"paper": [2, 4, 8], "paper_gpu": [4, 8]}[name]
  assert len(s.runs) == len(positions) * len(layers) * 3
  assert s.runs[0].name == f"rope-L{layers[0]}-s0" and s.runs[-1].name == f"{positions[-1]}-L{layers[-1]}-s2"
  if name == "paper_gpu":
    c = s.runs[0].config
    assert (c.model.d_model, c.model.num_heads, c.data.seq_len, c.train.batch_size, c.train.steps, c.model.dtype) == \
        (512, 8, 512, 64, 5000, "bfloat16")


# ---------------------------------------------------------------------------- print and slurm output


def parse_train_line(argv: list[str]) -> tuple[str, ml_collections.ConfigDict]:
  """``(workdir, config)`` exactly as train.py's flags would parse ``argv``."""
  assert argv[:2] == ["python", "train.py"]
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv[1:])
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_string("seeds", None, "", flag_values=fv)
  fv(argv[1:])
  return fv.workdir, fv.config


def test_command_lines_parse_back_to_each_runs_config(tmp_path):
  vary = (("model.position", ("rope", "swa")), ("train.learning_rate", (3e-3, 1e-4)),
          ("mesh.axes", (("data",),)), ("data.bos", ("none",)))
  s = sweep_lib.expand(sweep_cfg(vary, **{"analyze.num_sequences": 8, "analyze.skip_interventions": True}))
  jobs = sweep_lib.jobs(s, str(tmp_path))
  lines = sweep_lib.commands_text(jobs).splitlines()
  assert len(lines) == len(s.runs) == 4
  for line, run in zip(lines, s.runs):
    train, analyse = [shlex.split(part) for part in line.split(" && ")]
    workdir, config = parse_train_line(train)
    assert workdir == str(tmp_path / run.name)
    assert config_lib.to_dict(config) == config_lib.to_dict(run.config)
    assert analyse == ["python", "analyze.py", f"--workdir={tmp_path / run.name}", "--num_sequences=8",
                       "--skip_interventions"]


def test_analysis_can_be_disabled(tmp_path):
  s = sweep_lib.expand(sweep_cfg((("train.seed", (0, 1)),), **{"analyze.enabled": False}))
  lines = sweep_lib.commands_text(sweep_lib.jobs(s, str(tmp_path))).splitlines()
  assert len(lines) == 2 and all("&&" not in line and "analyze.py" not in line for line in lines)


def test_slurm_script_selects_line_k_plus_one_for_task_k(tmp_path):
  s = sweep_lib.expand(sweep_cfg(FAMILY[:2], **{"slurm.partition": "gpu", "slurm.extra": ("--mem=16G",),
                                               "slurm.max_parallel": 2}))
  jobs = sweep_lib.jobs(s, str(tmp_path))
  (tmp_path / "commands.sh").write_text(sweep_lib.commands_text(jobs))
  script = sweep_lib.sbatch_text(s, str(tmp_path), len(jobs))
  head = [line for line in script.splitlines() if line.startswith("#SBATCH")]
  assert "#SBATCH --array=0-3%2" in head
  assert f"#SBATCH --output={tmp_path}/logs/%A_%a.out" in head
  assert {"#SBATCH --partition=gpu", "#SBATCH --mem=16G", "#SBATCH --gpus-per-task=1", "#SBATCH --time=04:00:00",
          "#SBATCH --cpus-per-task=8"} <= set(head)
  assert f"cd {REPO}" in script.splitlines() and "source .venv/bin/activate" in script.splitlines()
  select = next(line for line in script.splitlines() if line.startswith("line=$(sed -n"))
  for k, job in enumerate(jobs):
    out = subprocess.run(["bash", "-c", f"SLURM_ARRAY_TASK_ID={k}; {select}; printf '%s' \"$line\""],
                         capture_output=True, text=True, check=True).stdout
    assert out == job.line()


def test_cli_print_and_slurm_write_their_files(tmp_path):
  sweep_file = tmp_path / "family.py"
  sweep_file.write_text(
      "import ml_collections\nfrom abspos_jax.sweep import sweep_defaults\n\n\ndef get_config():\n"
      "  c = sweep_defaults()\n"
      f"  c.overrides = ml_collections.ConfigDict({SMALL!r})\n"
      f"  c.vary = {FAMILY!r}\n  return c\n")
  root = tmp_path / "root"
  cmd = [sys.executable, "-m", "abspos_jax.sweep", f"--sweep={sweep_file}", f"--root={root}",
         "--sweep.overrides.train.steps=6", "--sweep.analyze.num_sequences=16", "--only=ntk"]
  r = subprocess.run(cmd + ["--launch=print"], capture_output=True, text=True, cwd=REPO)
  assert r.returncode == 0, r.stderr
  lines = (root / "commands.sh").read_text().splitlines()
  assert len(lines) == 4 and all("--workdir=" + str(root / "ntk-") in line for line in lines)
  assert all("--config.train.steps=6 " in line and line.endswith("--num_sequences=16") for line in lines)
  assert r.stdout.splitlines()[:4] == lines
  record = json.loads((root / "sweep.json").read_text())
  assert [x["name"] for x in record["runs"]][:2] == ["rope-L2-s0", "rope-L2-s1"] and len(record["runs"]) == 8
  assert record["overrides"]["train.steps"] == 6 and record["commands"] == lines
  assert record["vary"][0] == ["model.position", ["rope", "ntk"]]
  out = []  # the same sweep as the CLI resolved it, launched as a slurm array in-process
  sweep_lib.execute(config_lib.load_config_file(str(sweep_file)), str(root), "slurm", only="ntk", echo=out.append)
  assert "#SBATCH --array=0-3\n" in (root / "sweep.sbatch").read_text()
  assert f"submit:  sbatch {root}/sweep.sbatch" in out
  with pytest.raises(SweepError, match="from sweep.vary model.num_heads=3"):
    c = config_lib.load_config_file(str(sweep_file))
    c.vary = (("model.num_heads", (4, 3)),)
    sweep_lib.execute(c, str(root), "print", echo=out.append)


def test_dry_run_writes_nothing(tmp_path):
  out = []
  sweep_lib.execute(sweep_cfg(FAMILY), str(tmp_path / "root"), "slurm", dry_run=True, echo=out.append)
  assert not (tmp_path / "root").exists()
  assert "#SBATCH --array=0-7" in out[0]


# ---------------------------------------------------------------------------- skip and resume


def fake_run(workdir, steps=(), tmp=(), analysed=None, config=None):
  """A run directory as train.py / analyze.py leave it: orbax step dirs, a save in progress, a summary."""
  os.makedirs(workdir, exist_ok=True)
  for s in steps:
    os.makedirs(os.path.join(workdir, "checkpoints", str(s), "params"), exist_ok=True)
  for s in tmp:
    os.makedirs(os.path.join(workdir, "checkpoints", f"{s}.orbax-checkpoint-tmp-1712345678"))
  if analysed is not None:
    os.makedirs(os.path.join(workdir, "analysis"), exist_ok=True)
    with open(os.path.join(workdir, "analysis", "summary.json"), "w") as f:
      json.dump({"meta": {"step": analysed}, "main_policy": "prepend", "estimators": sweep_lib.ESTIMATORS}, f)
  if config is not None:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(config_lib.to_dict(config), f)


def test_state_reads_only_complete_checkpoints(tmp_path):
  w = str(tmp_path / "r")
  assert sweep_lib.read_state(w, config_lib.base_config()) == RunState(None, None, ())
  fake_run(w, steps=(2,), tmp=(4,))
  open(os.path.join(w, "checkpoints", "9"), "w").close()  # a file, not a step directory
  assert sweep_lib.latest_checkpoint_step(w) == 2
  fake_run(w, steps=(4,), analysed=2)
  assert sweep_lib.read_state(w, config_lib.base_config()) == RunState(4, 2, ())
  with open(os.path.join(w, "analysis", "summary.json"), "w") as f:
    json.dump({"meta": {"step": 4}, "main_policy": "prepend"}, f)  # v1 estimators (no "estimators"): analyse again
  assert sweep_lib.analysed_step(w) is None
  with open(os.path.join(w, "analysis", "summary.json"), "w") as f:
    f.write('{"meta": {"st')  # damaged: not analysed
  assert sweep_lib.analysed_step(w) is None


def test_state_reports_a_different_config(tmp_path):
  c = config_lib.base_config()
  fake_run(str(tmp_path), config=c)
  assert sweep_lib.read_state(str(tmp_path), c).config_diff == ()
  other = c.copy_and_resolve_references()
  other.model.num_layers = 6
  other.train.log_every = 1  # resumable: not a difference
  assert sweep_lib.read_state(str(tmp_path), other).config_diff == ("model.num_layers",)


@pytest.mark.parametrize("states, analyse, expected", [
    ([RunState()], True, Decision("train")),
    ([RunState(2)], True, Decision("resume", "from step 2")),
    ([RunState(4)], True, Decision("analyse")),
    ([RunState(4, 2)], True, Decision("analyse")),  # analysed at an older checkpoint
    ([RunState(4, 4)], True, Decision("skip", "finished")),
    ([RunState(4)], False, Decision("skip", "finished")),
    ([RunState(4, 4), RunState(4, 4), RunState(2, 2)], True, Decision("resume", "from step 2")),
    ([RunState(4, 4), RunState(None), RunState(4, 4)], True, Decision("train")),
    ([RunState(4, 4), RunState(4), RunState(4, 4)], True, Decision("analyse")),
    ([RunState(4, 4, ("model.num_layers",))], True,
     Decision("conflict", "its workdir holds a run with a different config (model.num_layers)")),
])
def test_decide(states, analyse, expected):
  assert sweep_lib.decide(states, steps=4, analyse=analyse) == expected


@pytest.fixture(autouse=True)
def _sweep_cache_default(monkeypatch):
  """Without the test run's shared compilation cache (conftest): the sweep's own default is under test."""
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)


class FakeRunner:
  """Stands in for the subprocesses: training writes the final checkpoint, analysis a summary."""

  def __init__(self, fail=(), stop_at=None):
    self.calls, self.fail, self.stop_at = [], fail, stop_at

  def __call__(self, argv, log_path, env):
    assert argv[0] == sys.executable
    assert env["JAX_COMPILATION_CACHE_DIR"].endswith("jax_cache") and env["PATH"] == os.environ["PATH"]
    args = dict(a[2:].split("=", 1) for a in argv[2:] if a.startswith("--") and "=" in a)
    self.calls.append((argv[1], args["workdir"], os.path.basename(log_path)))
    if any(f in args["workdir"] for f in self.fail):
      return 1
    seeds = args["seeds"].split(",") if "seeds" in args else [None]
    steps = int(args.get("config.train.steps", 4))
    for seed in seeds:
      w = args["workdir"].format(seed=seed)
      if argv[1] == "train.py":
        fake_run(w, steps=(self.stop_at or steps,))
      else:
        fake_run(w, analysed=sweep_lib.latest_checkpoint_step(w))
    return 0


def test_local_skips_resumes_analyses_and_goes_on_after_a_failure(tmp_path):
  root = tmp_path / "root"
  c = sweep_cfg((("model.position", ("rope", "ntk", "swa", "nope", "learned")),
                 ("model.num_layers", (2, 3))))
  fake_run(str(root / "rope-L2"), steps=(2, 4), analysed=4)  # finished and analysed
  fake_run(str(root / "rope-L3"), steps=(2, 4), analysed=2)  # finished, analysed at an older step
  fake_run(str(root / "ntk-L2"), steps=(2,), tmp=(4,))  # interrupted while saving step 4
  fake_run(str(root / "ntk-L3"), config=sweep_lib.expand(c).runs[3].config)  # started, nothing saved yet
  other = sweep_lib.expand(c).runs[0].config  # swa-L2's workdir holds another run
  fake_run(str(root / "swa-L2"), steps=(4,), config=other)
  runner, out, compared = FakeRunner(fail=("nope-L2",)), [], []
  failures = sweep_lib.execute(c, str(root), "local", runner=runner, echo=out.append,
                               compare=lambda dirs, dest: compared.append((dirs, dest)))
  lines = [re.sub(r"\(\d+ s\)", "(T s)", line) for line in out]
  assert lines == [
      f"10 jobs (10 runs) in {root}",
      "[1/10] rope-L2: skipped (finished)",
      "[2/10] rope-L3: analysed (T s)",
      "[3/10] ntk-L2: resumed from step 2, trained (T s), analysed (T s)",
      "[4/10] ntk-L3: trained (T s), analysed (T s)",
      "[5/10] swa-L2: FAILED: its workdir holds a run with a different config (model.position)",
      "[6/10] swa-L3: trained (T s), analysed (T s)",
      f"[7/10] nope-L2: FAILED: training exited with status 1, see {root}/nope-L2/train.log",
      "[8/10] nope-L3: trained (T s), analysed (T s)",
      "[9/10] learned-L2: trained (T s), analysed (T s)",
      "[10/10] learned-L3: trained (T s), analysed (T s)",
      f"comparison of 8 analysed runs: {root}/comparison/comparison.md",
  ]
  assert [call for call in runner.calls if "rope" in call[1]] == [
      ("analyze.py", str(root / "rope-L3"), "analyze.log")]
  assert runner.calls[1:3] == [("train.py", str(root / "ntk-L2"), "train.log"),
                               ("analyze.py", str(root / "ntk-L2"), "analyze.log")]
  assert [f.split(":")[0] for f in failures] == ["swa-L2", "nope-L2"]
  assert compared == [([str(root / n) for n in ("rope-L2", "rope-L3", "ntk-L2", "ntk-L3", "swa-L3", "nope-L3",
                                               "learned-L2", "learned-L3")], str(root / "comparison"))]
  assert (root / "commands.sh").read_text().count("\n") == 10 and (root / "sweep.json").exists()

  # A rerun skips everything that finished; --only narrows to one run.
  runner, out = FakeRunner(), []
  failures = sweep_lib.execute(c, str(root), "local", runner=runner, echo=out.append, only="nope-L2",
                               compare=lambda dirs, dest: None)
  assert failures == [] and [call[0] for call in runner.calls] == ["train.py", "analyze.py"]
  runner, out = FakeRunner(), []
  sweep_lib.execute(c, str(root), "local", runner=runner, echo=out.append, only="L3", compare=lambda d, o: None)
  assert runner.calls == [] and all("skipped (finished)" in line for line in out[1:-1])


def test_local_reports_a_run_stopped_early_and_does_not_analyse_it(tmp_path):
  runner, out = FakeRunner(stop_at=2), []
  failures = sweep_lib.execute(sweep_cfg(()), str(tmp_path), "local", runner=runner, echo=out.append,
                               compare=lambda d, o: None)
  assert failures == ["run: training stopped before step 4 (run at step 2); rerun to go on"]
  assert [call[0] for call in runner.calls] == ["train.py"]


def test_local_dry_run_says_what_it_would_do(tmp_path):
  fake_run(str(tmp_path / "s1"), steps=(2,))
  out, runner = [], FakeRunner()
  sweep_lib.execute(sweep_cfg((("train.seed", (0, 1)),)), str(tmp_path), "local", dry_run=True, runner=runner,
                    echo=out.append)
  assert out[1:] == ["[1/2] s0: would train, then analyse", "[2/2] s1: would resume from step 2, then analyse"]
  assert runner.calls == [] and not (tmp_path / "sweep.json").exists()


# ---------------------------------------------------------------------------- seeds together


def test_seeds_together_groups_runs_that_differ_only_in_the_seed(tmp_path):
  vary = (("train.seed", (0, 1, 2)), ("model.position", ("rope", "swa")))  # the seed need not be outermost
  s = sweep_lib.expand(sweep_cfg(vary, seeds_together=True))
  jobs = sweep_lib.jobs(s, str(tmp_path))
  assert [j.label for j in jobs] == ["s{seed}-rope", "s{seed}-swa"]
  assert [[r.name for r in j.runs] for j in jobs] == [["s0-rope", "s1-rope", "s2-rope"],
                                                      ["s0-swa", "s1-swa", "s2-swa"]]
  line = sweep_lib.commands_text(jobs).splitlines()[1]
  train, *analyses = [shlex.split(part) for part in line.split(" && ")]
  assert train[:5] == ["python", "train.py", "--config=configs/base.py", f"--workdir={tmp_path}/s{{seed}}-swa",
                       "--seeds=0,1,2"]
  assert not any(a.startswith("--config.train.seed=") for a in train)
  _, config = parse_train_line(train)
  assert config.model.position == "swa" and config.model.d_model == 32
  assert [a[2] for a in analyses] == [f"--workdir={tmp_path}/s{k}-swa" for k in range(3)]
  # Without seed in vary there is nothing to group: one ordinary command per run.
  s = sweep_lib.expand(sweep_cfg((("model.position", ("rope", "swa")),), seeds_together=True))
  assert [j.train_argv[4] for j in sweep_lib.jobs(s, str(tmp_path))] == \
      ["--config.checkpoint.every=2"] * 2


def test_seeds_together_local_reruns_a_group_until_every_seed_is_done(tmp_path):
  c = sweep_cfg((("model.position", ("rope", "swa")), ("train.seed", (0, 1, 2))), seeds_together=True)
  fake_run(str(tmp_path / "rope-s0"), steps=(4,), analysed=4)
  fake_run(str(tmp_path / "rope-s1"), steps=(4,), analysed=4)
  fake_run(str(tmp_path / "rope-s2"), steps=(2,))
  for k in range(3):
    fake_run(str(tmp_path / f"swa-s{k}"), steps=(4,), analysed=4)
  runner, out = FakeRunner(), []
  failures = sweep_lib.execute(c, str(tmp_path), "local", runner=runner, echo=out.append, compare=lambda d, o: None)
  assert failures == []
  assert [re.sub(r"\(\d+ s\)", "(T s)", line) for line in out[1:]] == [
      "[1/2] rope-s{seed}: resumed from step 2, trained (T s), analysed (T s)",
      "[2/2] swa-s{seed}: skipped (finished)",
      f"comparison of 6 analysed runs: {tmp_path}/comparison/comparison.md"]
  assert runner.calls == [("train.py", f"{tmp_path}/rope-s{{seed}}", "rope-s0_1_2.train.log"),
                          ("analyze.py", f"{tmp_path}/rope-s2", "analyze.log")]
