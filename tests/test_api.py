"""analyze_run and analyze.py on a trained run: every output, bad inputs refused before writing, a checkpoint
sharded over 8 devices."""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from abspos_jax import model as model_lib
from abspos_jax.analysis import analyze_lengths, analyze_run
from abspos_jax.analysis import api
from abspos_jax.analysis.outputs.lengths import parse_seq_lens
from abspos_jax.data import BOS_ID
from abspos_jax.loss import lm_loss
from conftest import small_config
from helpers import FAST, ROOT, hooked_run, multihost_reference, sequences


@pytest.fixture
def run_dir():
  return hooked_run()


def test_cli_writes_every_output(run_dir, tmp_path):
  out = tmp_path / "analysis"
  r = subprocess.run([sys.executable, "analyze.py", f"--workdir={run_dir}", f"--out={out}", "--num_sequences=8",
                      "--batch_size=4", "--closedness_sequences=2"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  names = set(os.listdir(out))
  assert {"summary.json", "stats.npz", "report.md", "log_z.png", "sink_mass.png", "position0.png", "fingerprint.png",
          "components.png", "interventions.png"} <= names
  s = json.loads((out / "summary.json").read_text())
  L = 2
  assert len(s["sink_rate"]) == L and len(s["fingerprint"]["bos"]) == L + 1 and len(s["fingerprint"]["no_bos"]) == L + 1
  for key in ("causal_mask", "residual_stream", "causal_mask_early", "residual_stream_early"):
    assert len(s["components"][key]) == L
  assert s["closedness_max_abs_diff"] == 0.0 and s["meta"]["step"] == 4
  assert s["meta"]["options"]["closedness_sequences"] == 2
  for name in ("bos_replace", "pos0_patch", "sink_ablate"):
    assert name in s["interventions"]
  stats = np.load(out / "stats.npz")
  assert stats["tokens"].shape == (8, 16) and (stats["tokens"][:, 0] == BOS_ID).all()
  assert stats["log_z"].shape == (L, 4, 16) and stats["sink_mass"].shape == (L, 4, 16)
  assert stats["log_visible"].shape == (16,) and stats["pos0_norm"].shape == (L + 1,)
  assert "![log_z.png](log_z.png)" in (out / "report.md").read_text()
  cmp = subprocess.run([sys.executable, "analyze.py", "--compare", str(out), str(out), f"--out={tmp_path / 'cmp'}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert cmp.returncode == 0, cmp.stderr[-2000:]
  rows = [l.split(" | ") for l in (tmp_path / "cmp" / "comparison.md").read_text().splitlines()
          if l.startswith("| ") and not l.startswith("| group")]
  assert len(rows) == 1 and rows[0][1] == "2", rows  # the run twice: one group of two
  assert rows[0][2] == f"{s['loss'][s['main_policy']]:.3f} ± 0.000"  # its loss, no spread


def test_cli_bad_inputs_write_nothing(run_dir, tmp_path):
  def fails(*args, match):
    r = subprocess.run([sys.executable, "analyze.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and match in r.stderr, r.stderr[-2000:]
  fails(f"--workdir={tmp_path / 'missing'}", match="does not exist")
  fails(f"--workdir={tmp_path}", match="is not an abspos_jax run")
  fails(f"--workdir={run_dir}", "--step=3", f"--out={tmp_path / 'a'}", match="available steps: [2, 4]")
  fails(f"--workdir={run_dir}", "--num_sequences=0", f"--out={tmp_path / 'b'}", match="--num_sequences must be >= 2")
  fails(f"--workdir={run_dir}", "--seq_len=64", f"--out={tmp_path / 'c'}", match="longer than the 16 tokens")
  fails(f"--workdir={run_dir}", "--seq_lens=8,16k", f"--out={tmp_path / 'd'}",
        match="--seq_lens takes token counts T or T:N (N sequences at T tokens), e.g. 128,512,8192:8; got '16k'")
  (tmp_path / "file").write_text("x")
  fails(f"--workdir={run_dir}", f"--out={tmp_path / 'file' / 'analysis'}", match="cannot write there")
  assert sorted(os.listdir(tmp_path)) == ["file"]


def test_leakage_against_context_length(run_dir, tmp_path):
  """``analyze_lengths``: the run analysed at 8 (6 sequences) and 16 tokens (8), each a full analysis, then
  lengths.json, the figure and the table, every share with its interval; a rerun of the same request keeps both
  lengths, another request analyses them again."""
  out, calls = tmp_path / "lengths", []

  def analyse(t, n, where):
    calls.append((t, n))
    return analyze_run(run_dir, out=where, num_sequences=n or 8, seq_len=t, options=FAST)

  pairs = parse_seq_lens(["16", "8:6", "16"])
  assert pairs == [(8, 6), (16, None)]
  records = analyze_lengths(pairs, str(out), analyse, source=str(run_dir), request={"num_sequences": 8})
  assert calls == [(8, 6), (16, None)] and [r["seq_len"] for r in records] == [8, 16]
  for t, n in ((8, 6), (16, 8)):
    assert json.loads((out / f"seq_len_{t}" / "summary.json").read_text())["num_sequences"] == n
  saved = json.loads((out / "lengths.json").read_text())
  assert saved["source"] == str(run_dir) and [r["seq_len"] for r in saved["lengths"]] == [8, 16]
  for r in saved["lengths"]:
    lo, hi = r["residual_stream_share_ci"]
    assert lo <= r["residual_stream_share"] <= hi and len(r["log_z_slope_layer"]) == 2
  table = [l for l in (out / "report.md").read_text().splitlines() if l.startswith("| 8 |") or l.startswith("| 16 |")]
  assert len(table) == 2 and all(l.count(" [") >= 6 for l in table), table  # six shares and scores with intervals
  assert table[0].startswith("| 8 | 6 |") and table[1].startswith("| 16 | 8 |")  # the sequences per length
  from PIL import Image
  assert Image.open(out / "lengths.png").size[0] > 1000
  assert analyze_lengths(pairs, str(out), analyse, source=str(run_dir), request={"num_sequences": 8}) == records
  assert len(calls) == 2  # the same request: both lengths kept
  analyze_lengths([(8, 6)], str(out), analyse, source=str(run_dir), request={"num_sequences": 4})
  assert calls[2:] == [(8, 6)]  # another request: analysed again


def test_cli_leakage_against_context_length(run_dir, tmp_path):
  """``analyze.py --seq_lens=8:2``: the flags to request.json, one length of 2 sequences, named by the run's
  directory and texts in lengths.json and report.md."""
  out = tmp_path / "lengths"
  r = subprocess.run([sys.executable, "analyze.py", f"--workdir={run_dir}", "--seq_lens=8:2", f"--out={out}",
                      "--data=synthetic", "--skip_interventions", "--closedness_sequences=1"], cwd=ROOT,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads((out / "request.json").read_text())["skip_interventions"] is True
  saved = json.loads((out / "lengths.json").read_text())
  label = f"{os.path.basename(run_dir)}, data synthetic"
  assert saved["source"] == label and [(x["seq_len"], x["num_sequences"]) for x in saved["lengths"]] == [(8, 2)]
  assert (out / "report.md").read_text().startswith(f"# Leakage against context length: {label}\n")


def test_seq_lens_are_checked():
  assert parse_seq_lens([" 512:4", "128"]) == [(128, None), (512, 4)]
  for bad, match in ((["1"], "lengths >= 2"), (["64:1"], ">= 2 sequences"), (["8x"], "T or T:N"),
                     (["64:4", "64:8"], "64 tokens twice, with 4 and 8 sequences"), ([], "at least one length")):
    with pytest.raises(ValueError, match=match):
      parse_seq_lens(bad)


@pytest.mark.slow
def test_checkpoint_from_8_devices_analyses_on_one(tmp_path):
  """The shared run trained on a (data, fsdp, tensor) = (2, 2, 2) mesh of 8 devices, analysed in this 1-device
  process."""
  result = analyze_run(multihost_reference(), out=str(tmp_path / "analysis"), num_sequences=8, options=FAST)
  assert result.summary["closedness_max_abs_diff"] == 0.0
  assert json.loads((tmp_path / "analysis" / "summary.json").read_text())["meta"]["step"] == 4


@pytest.mark.parametrize("window", [None, 4])
def test_a_variants_reference_loss_in_query_blocks_is_the_plain_forwards(window):
  """The unmodified model's loss beside a variant's runs the attention in blocks of queries (so that 16,384 tokens
  fit) and equals the plain forward's loss, globally and with a window."""
  m = model_lib.create(small_config(**{"data.seq_len": 64, "model.window": window}))
  t = sequences(n=4, t=64)["prepend"]
  plain = float(lm_loss(m(jnp.asarray(t[:, :-1])), jnp.asarray(t[:, 1:])))
  for block in (None, 16):
    assert api._unmodified_loss(m, t, 2, block) == pytest.approx(plain, abs=1e-5)
