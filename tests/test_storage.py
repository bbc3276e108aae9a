"""Runs in object storage: ``gs://`` workdirs for training, resuming, analysis, sweeps and export, against a
Cloud Storage emulator on loopback (``tests/gcs_emulator.py``)."""

import os
import re
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest

from abspos_jax import checkpoint, storage
from abspos_jax.analysis import AnalysisOptions, analyze_run
from abspos_jax import sweep as sweep_lib
from abspos_jax.metrics import read_metrics
from conftest import SMALL
from gcs_emulator import Emulator
from helpers import (ROOT, MESH_RUN as MESH, assert_same, command, losses, multihost_reference, one_process, records,
                     seed_compile_cache, summary_numbers, sweep_cfg, two_processes, two_seed_sweep, wait_for)


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
  with Emulator(str(tmp_path_factory.mktemp("gcs") / "server.log")) as e:
    yield e.create_bucket("abspos-test")


@pytest.fixture
def staging(tmp_path, monkeypatch):
  """The sweep's local staging directory (logs, Slurm files, compile cache) under tmp_path, not the repository;
  the compile cache is the sweep's own default."""
  monkeypatch.setenv("ABSPOS_STAGING_DIR", str(tmp_path / "staging"))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  return tmp_path / "staging"


def run(argv, **kw):
  r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900, **kw)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return r


def test_paths_and_single_object_writes(bucket):
  assert storage.is_remote("gs://b/x") and not storage.is_remote("runs/x") and not storage.is_remote("/abs/x")
  assert storage.join("gs://b/x", "c", "d.json") == "gs://b/x/c/d.json"
  assert storage.join("runs/x", "c") == os.path.join("runs/x", "c")
  assert storage.absolute("gs://b/x") == "gs://b/x" and storage.absolute("x") == os.path.abspath("x")
  assert storage.name("gs://b/x/run-s0") == "run-s0" and storage.name("runs/r/") == "r"
  assert storage.local_staging("gs://b/some/dir", "/base") == "/base/gs/b/some/dir"
  assert storage.local_staging("runs/x", "/base") == "runs/x"
  p = f"{bucket}/single/a.json"
  storage.write_json(p, {"k": [1, 2]})
  assert storage.read_json(p) == {"k": [1, 2]}
  storage.write_json(p, {"k": 3})  # an object is replaced whole
  assert storage.read_json(p) == {"k": 3}


def _fill(tmp, tag, extra=False):
  for name in ("stats.npz", "report.md", "summary.json"):
    with open(os.path.join(tmp, name), "w") as f:
      f.write(tag)
  if extra:
    os.makedirs(os.path.join(tmp, "sub"))
    with open(os.path.join(tmp, "sub", "x.png"), "w") as f:
      f.write(tag)


def test_a_directory_is_uploaded_marker_last_and_a_failure_leaves_no_marker(bucket, monkeypatch):
  run_dir = f"{bucket}/dir"
  out = f"{run_dir}/analysis"
  with storage.directory(out, ".t-", marker="summary.json") as tmp:
    _fill(tmp, "v1", extra=True)
  assert storage.read_text(f"{out}/sub/x.png") == "v1"
  order, real = [], storage.write_bytes
  monkeypatch.setattr(storage, "write_bytes", lambda p, d: (order.append(storage.name(p)), real(p, d)))
  with storage.directory(out, ".t-", marker="summary.json") as tmp:
    _fill(tmp, "v2")
  assert order[-1] == "summary.json" and sorted(order) == ["report.md", "stats.npz", "summary.json"]
  assert not storage.path(f"{out}/sub").exists()  # replaced, not merged with the old directory
  with pytest.raises(RuntimeError):  # a crash while the results are computed: the previous ones stay
    with storage.directory(out, ".t-", marker="summary.json") as tmp:
      _fill(tmp, "v3")
      raise RuntimeError("killed")
  assert storage.read_text(f"{out}/summary.json") == "v2"

  def failing(p, d):
    if storage.name(p) == "stats.npz":
      raise OSError("connection reset")
    real(p, d)

  monkeypatch.setattr(storage, "write_bytes", failing)
  storage.write_json(f"{out}/summary.json", {"meta": {"step": 4}, "estimators": sweep_lib.ESTIMATORS})
  assert sweep_lib.analysed_step(run_dir) == 4
  with pytest.raises(OSError):  # a crash mid-upload: no marker, so the run reads as not analysed
    with storage.directory(out, ".t-", marker="summary.json") as tmp:
      _fill(tmp, "v4")
  assert not storage.path(f"{out}/summary.json").exists()
  assert sweep_lib.analysed_step(run_dir) is None


def test_print_and_slurm_launches_write_the_bucket_and_a_local_staging_dir(bucket, staging):
  root = f"{bucket}/launch"
  cfg = sweep_cfg((("train.seed", (0, 1)),), SMALL)
  sweep_lib.execute(cfg, root, "print", echo=lambda s: None)
  sweep_lib.execute(cfg, root, "slurm", echo=lambda s: None)
  local = staging / "gs" / "abspos-test" / "launch"
  lines = storage.read_text(f"{root}/commands.sh").splitlines()
  assert (local / "commands.sh").read_text().splitlines() == lines
  assert [f"--workdir={root}/s{k}" in line for k, line in enumerate(lines)] == [True, True]
  assert [r["workdir"] for r in storage.read_json(f"{root}/sweep.json")["runs"]] == [f"{root}/s0", f"{root}/s1"]
  assert sweep_lib.local_env(root)["JAX_COMPILATION_CACHE_DIR"] == str(local / "jax_cache")  # the compile cache stays local
  script = (local / "sweep.sbatch").read_text()
  assert f"{local}/commands.sh" in script and f"--output={local}/logs/" in script


def partial_save(workdir):
  """A step directory of ``workdir`` in the bucket without orbax's commit marker: a save in progress."""
  d = storage.path(storage.join(workdir, "checkpoints"))
  return d.exists() and any(c.is_dir() and not (c / "commit_success.txt").exists() for c in d.iterdir())


@pytest.mark.slow
def test_train_in_a_bucket_resumes_identically_after_kill_9(bucket, tmp_path):
  """Train to gs://, stop at a step, refuse another config, SIGKILL twice (after some steps, mid-save), resume."""
  steps = ["--config.train.steps=12", "--config.checkpoint.every=2", "--config.checkpoint.keep=1",
           "--config.checkpoint.keep_period=4", "--config.train.emergence=False"]
  ref = tmp_path / "ref"
  run(command(ref, *steps))
  work = f"{bucket}/train/run"
  run(command(work, *steps, "--config.train.stop_at_step=4"))
  assert checkpoint.saved_steps(work) == [4] and max(losses(work)) == 4
  r = subprocess.run(command(work, *steps, "--config.model.d_model=32"), cwd=ROOT, capture_output=True, text=True,
                     timeout=600)
  assert r.returncode != 0 and "different config" in r.stderr and "model.d_model" in r.stderr
  hits = []
  for when in ("after_steps", "mid_save"):
    proc = subprocess.Popen(command(work, *steps), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if when == "after_steps":
      hits.append(wait_for(lambda: len(read_metrics(work)) >= 6, proc, timeout=600))
    else:
      hits.append(wait_for(lambda: partial_save(work), proc, timeout=600))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  assert hits[0], "the first kill came after training had finished"
  run(command(work, *steps))
  assert losses(work) == losses(ref)  # every logged step, bit for bit
  assert checkpoint.saved_steps(work) == [4, 8, 12]  # keep=1 plus every 4th step, as on a local disk
  assert storage.read_json(f"{work}/config.json")["train"]["steps"] == 12
  assert any(storage.path(f"{work}/tensorboard").iterdir())
  # provenance in the bucket: the start and every resume after a kill, each naming the code
  events = storage.read_json(f"{work}/provenance.json")
  assert events[0]["event"] == "train" and all(e["event"] == "resume" and e["step"] > 0 for e in events[1:])
  assert all(e["code"]["git_commit"] for e in events)


@pytest.fixture(scope="module")
def trained(bucket, tmp_path_factory):
  """A run trained into the bucket (checkpoints at steps 2 and 4)."""
  work = f"{bucket}/analysed/run"
  run(command(work, "--config.train.steps=4", "--config.checkpoint.every=2", "--config.checkpoint.keep=2",
              "--config.train.emergence=False"))
  return work


@pytest.mark.slow
def test_analyse_all_steps_compare_and_export_from_a_bucket(bucket, trained, tmp_path):
  analyse = [sys.executable, "analyze.py", "--num_sequences=4", "--skip_interventions"]
  run(analyse + [f"--workdir={trained}", "--all_steps"])
  for step in (2, 4):
    summary = storage.read_json(f"{trained}/analysis_steps/step_{step}/summary.json")
    assert summary["meta"]["workdir"] == trained and summary["meta"]["step"] == step
  names = {p.name for p in storage.path(f"{trained}/analysis").iterdir()}
  assert {"summary.json", "stats.npz", "report.md"} <= names and any(n.endswith(".png") for n in names)
  assert sweep_lib.analysed_step(trained) == 4
  assert [r["step"] for r in storage.read_json(f"{trained}/analysis_steps/steps.json")["steps"]] == [2, 4]
  out = f"{bucket}/analysed/comparison"
  run(analyse[:2] + ["--compare", f"--out={out}", trained, f"{trained}/analysis_steps/step_2"])
  assert {"comparison.json", "comparison.md", "comparison.png", "family.json"} <= {
      p.name for p in storage.path(out).iterdir()}
  export = [sys.executable, "-m", "abspos_jax.export_hf", f"--workdir={trained}"]
  run(export + [f"--out={bucket}/analysed/hf"])
  run(export + [f"--out={tmp_path / 'hf'}"])
  for name in ("config.json", "model.safetensors"):
    assert storage.path(f"{bucket}/analysed/hf/{name}").read_bytes() == (tmp_path / "hf" / name).read_bytes()


@pytest.mark.slow
def test_a_sweep_into_a_bucket_skips_and_resumes_from_bucket_state(bucket, staging, tmp_path):
  sweep_file = two_seed_sweep(tmp_path / "two.py", emergence=False)
  root = f"{bucket}/sweep"
  cache = staging / "gs" / "abspos-test" / "sweep" / "jax_cache"
  seed_compile_cache(cache)
  cmd = [sys.executable, "-m", "abspos_jax.sweep", f"--sweep={sweep_file}", f"--root={root}", "--launch=local"]
  first = run(cmd + ["--only=s0"]).stdout.splitlines()
  assert re.fullmatch(r"\[1/\d\] s0: trained \(\d+ s\), analysed \(\d+ s\)", first[1]), first
  assert sweep_lib.latest_checkpoint_step(f"{root}/s0") == 4 and sweep_lib.analysed_step(f"{root}/s0") == 4
  assert "loss" in storage.read_text(f"{root}/s0/metrics.jsonl")
  assert "$ " in storage.read_text(f"{root}/s0/train.log")  # the local log, appended to the bucket's copy
  printed = run([*cmd[:-1], "--launch=print", "--only=s1", "--dry_run"]).stdout.splitlines()[0]
  s1_train = printed.split(" && ")[0]  # seed 1's training command, as the sweep runs it
  run([sys.executable, *shlex.split(s1_train)[1:], "--config.train.stop_at_step=2"])
  r = run(cmd)
  lines = r.stdout.splitlines()
  assert len(lines) >= 3 and lines[1] == "[1/2] s0: skipped (finished)", r.stdout + r.stderr[-2000:]
  assert lines[2].startswith("[2/2] s1: resumed from step 2, trained") and "analysed" in lines[2], r.stdout
  assert sweep_lib.analysed_step(f"{root}/s1") == 4
  [row] = storage.read_json(f"{root}/comparison/comparison.json").values()
  assert row["seeds"] == [0, 1] and row["loss"]["std"] is not None, r.stdout  # one group, spread over the seeds
  assert not storage.path(f"{root}/jax_cache").exists()


@pytest.mark.slow
def test_seeds_trained_together_into_a_bucket_match_a_local_disk(bucket, tmp_path):
  """``train.py --seeds`` with a ``gs://`` template: a directory per seed, time-sliced, the same losses as on disk."""
  args = ["--seeds=0,1", "--config.train.steps=4", "--config.checkpoint.every=2", "--config.train.emergence=False"]
  run(command(tmp_path / "s{seed}", *args))
  template = f"{bucket}/seeds/s{{seed}}"
  run(command(template, *args, "--config.train.stop_at_step=2"))
  assert [checkpoint.saved_steps(f"{bucket}/seeds/s{s}") for s in (0, 1)] == [[2], [2]]
  r = run(command(template, *args))
  assert "resumed from step 2" in r.stderr, r.stderr[-2000:]
  for s in (0, 1):
    work = f"{bucket}/seeds/s{s}"
    assert losses(work) == losses(tmp_path / f"s{s}")  # every logged step, bit for bit
    assert storage.read_json(f"{work}/config.json")["train"]["seed"] == s
    assert checkpoint.saved_steps(work) == [2, 4]




@pytest.mark.slow
def test_one_and_two_processes_take_turns_on_a_run_in_a_bucket(bucket, tmp_path):
  """A run in the bucket crosses between 1 and 2 JAX processes (8 devices either way): 1 process trains steps
  1-2, 2 processes resume for step 3, 1 process resumes for step 4 (the evaluations at 2 and 4 with the emergence
  hook), and every record matches the uninterrupted 1-process reference. Then 2 processes analyse it, only
  process 0 writing, with the numbers of an analysis in this one process."""
  reference = multihost_reference()
  work = f"{bucket}/multi/run"
  one_process("train.py", f"--workdir={work}", *MESH, "--config.train.stop_at_step=2")
  r = two_processes("train.py", f"--workdir={work}", *MESH, "--config.train.stop_at_step=3")
  assert "[p0] resumed from step 2" in r.stdout and "[p1] resumed from step 2" in r.stdout, r.stdout[-2000:]
  assert checkpoint.saved_steps(work)[-1] == 3 and not partial_save(work)
  assert [m["step"] for m in read_metrics(work)] == [1, 2, 3]  # one record per step: process 0's
  r = one_process("train.py", f"--workdir={work}", *MESH)
  assert "resumed from step 3" in r.stderr, r.stderr[-2000:]
  assert_same(records(work), records(reference))
  r = two_processes("analyze.py", f"--workdir={work}", "--num_sequences=8", "--batch_size=4", "--skip_interventions")
  assert "[p0] wrote" in r.stdout and "[p1] wrote" not in r.stdout, r.stdout[-2000:]
  two = storage.read_json(f"{work}/analysis/summary.json")
  assert two["meta"]["step"] == 4 and two["meta"]["provenance"]["analysis"]["machine"]["process_count"] == 2
  assert [e["event"] for e in two["meta"]["provenance"]["training"]] == ["train", "resume", "resume"]
  analyze_run(work, out=str(tmp_path / "one"), num_sequences=8,
              options=AnalysisOptions(batch_size=4, interventions=False, progress=False))
  one = storage.read_json(str(tmp_path / "one" / "summary.json"))
  np.testing.assert_allclose(summary_numbers(two), summary_numbers(one), rtol=1e-5, atol=1e-6)
