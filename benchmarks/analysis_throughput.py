"""Analysis throughput and memory: our jitted analysis pass against transformers + NumPy.

    python -m benchmarks.analysis_throughput [--sizes=tiny,medium] [--num_sequences=128] [--repeats=5]
    python -m benchmarks.analysis_throughput --memory [--sizes=tiny]
    python -m benchmarks.analysis_throughput --hf=CHECKPOINT --seq_len=1024 [--num_sequences=8] [--batch_size=2]

Ours: the baseline step of :mod:`abspos_jax.analysis.passes.steps` (what
``analyze(..., options=AnalysisOptions(interventions=False))`` runs once per
batch; ``finalize`` is a fixed cost independent of the number of sequences and
is not timed), jitted once, over all sequences in batches of ``--batch_size``,
its attention in the query blocks ``analyze`` tries first at that length
(:func:`abspos_jax.analysis.passes.memory.query_blocks`: whole up to 512 tokens).
It does more than the reference: besides the statistics the reference keeps it
runs the closedness check (two forwards of up to 4 sequences of the first batch) and
accumulates both ridge probes and the loss. Reference: :class:`benchmarks.hf_reference.HFAnalysis` on
the same weights, exported with :func:`abspos_jax.interop.hf.export`. Both
sides are timed interleaved in one process (see :mod:`benchmarks.common`), and
their per-query means must agree before anything is timed. ``--hf`` runs a
local checkpoint (a Hugging Face directory or a GGUF file, read by
:class:`abspos_jax.interop.hf.files.Checkpoint` and exported again so that
both sides hold the same float32 weights) at ``--seq_len`` instead of
``--sizes``.

At SmolLM2's size the two sides do not fit in one process at 1,024 tokens
(the reference's per-cell sums alone are 9 GB there), so ``--hf`` runs each
side in a fresh subprocess, one after the other: its first pass compiles
and writes its per-query means (compared in the parent), then ``--repeats``
timed passes; the table adds each side's peak RSS.

``--memory`` runs each side in a fresh subprocess per point and reports the
growth of the peak RSS over the RSS after imports and model loading, as the
number of sequences grows at fixed ``seq_len`` and as ``seq_len`` grows.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax.analysis.passes import steps
from abspos_jax.analysis.passes.memory import query_blocks
from abspos_jax.analysis.estimators import denominators, fixed_effects
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.core import fingerprint_groups, layer_visible
from abspos_jax.interop import hf
from benchmarks import common, hf_reference
from benchmarks.train_throughput import SIZES, size_config

INIT_STD = 0.15  # larger than the training init, so that attention is far from uniform


class OursPass:
  """The jitted baseline analysis step, folded over batches of sequences."""

  def __init__(self, model: model_lib.Decoder, tokens: np.ndarray, batch_size: int):
    self.graphdef, self.params = nnx.split(model, nnx.Param)
    seq_len = tokens.shape[1]
    self.spec, self.seq_len, self.batch_size = model.spec, seq_len, batch_size
    self.visible = layer_visible(model.spec, seq_len)
    design = fixed_effects.make_design(self.visible)
    # One fingerprint group per first token of ``tokens``, as analyze() groups them (not one per vocabulary entry).
    self.num_groups, groups = fingerprint_groups({"tokens": tokens}, model.spec.vocab_size)
    block = query_blocks(seq_len)[0]
    # Donating the accumulators, as analyze() does (see analysis.orchestrator for the copy below).
    self.step = jax.jit(steps.make_baseline_step(self.graphdef, design, {}, jnp.asarray(groups),
                                                 query_block=None if block == seq_len else block),
                        donate_argnums=1)

  def run(self, tokens: np.ndarray) -> dict:
    acc = jax.tree.map(jnp.copy, steps.init_accumulators(self.spec, self.seq_len, {},
                                                         AnalysisOptions().num_blocks, self.num_groups))
    for start in range(0, len(tokens), self.batch_size):
      stop = min(start + self.batch_size, len(tokens))
      acc = self.step(self.params, acc, jnp.asarray(tokens[start:stop]), jnp.arange(start, stop))
    return jax.block_until_ready(acc)

  def means(self, acc: dict) -> dict[str, np.ndarray]:
    return jax.device_get(denominators.finalize(acc["denominators"], self.visible))


class HFPass:
  def __init__(self, hf_model, seq_len: int, batch_size: int):
    self.hf_model, self.seq_len, self.batch_size = hf_model, seq_len, batch_size

  def run(self, tokens: np.ndarray) -> hf_reference.HFAnalysis:
    ref = hf_reference.HFAnalysis(self.hf_model, self.seq_len)
    for start in range(0, len(tokens), self.batch_size):
      stop = min(start + self.batch_size, len(tokens))
      ref.update(tokens[start:stop], np.arange(start, stop))
    return ref


def build(size: str, seq_len: int | None, workdir: str, checkpoint: str = ""):
  """Our model of ``size`` (optionally at another ``seq_len``), or the local ``checkpoint`` at ``seq_len``,
  and its transformers twin."""
  import transformers
  if checkpoint:
    ckpt = hf.Checkpoint(checkpoint)
    config = ckpt.config(seq_len)
    ours = ckpt.model(config)
  else:
    layers, d_model, heads, t, batch = SIZES[size]
    config = size_config(layers, d_model, heads, seq_len or t, batch, init_std=INIT_STD)
    ours = model_lib.create(config)
  out = os.path.join(workdir, f"hf_{size or 'checkpoint'}_{config.data.seq_len}")
  hf.export(config, ours, out)
  ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
  return config, ours, ref


def sequences(num: int, seq_len: int, vocab: int, seed: int = 0) -> np.ndarray:
  """Random byte tokens with BOS (id 256) at position 0, as the prepend policy gives."""
  x = np.random.default_rng(seed).integers(0, 256, (num, seq_len)).astype(np.int32)
  x[:, 0] = 256
  return x


def check_agree(ours: OursPass, ours_acc: dict, ref: hf_reference.HFAnalysis, size: str) -> float:
  """Largest difference between the two sides' per-query means; raises above 1e-3."""
  a, b = ours.means(ours_acc), ref.means()
  worst = max(float(np.max(np.abs(a[q] - b[q]))) for q in ("log_z", "entropy", "max_weight", "sink_mass"))
  if worst > 1e-3:
    raise AssertionError(f"{size}: ours and the transformers reference disagree by {worst}")
  return worst


def bench_size(size: str, num: int, repeats: int, batch_size: int, workdir: str, checkpoint: str = "",
               seq_len: int | None = None) -> dict:
  config, model, hf_model = build(size, seq_len, workdir, checkpoint)
  t = config.data.seq_len
  tokens = sequences(num, t, config.model.vocab_size)
  ours, ref = OursPass(model, tokens, batch_size), HFPass(hf_model, t, batch_size)
  max_diff = check_agree(ours, ours.run(tokens), ref.run(tokens), size)  # also compiles ours
  times = common.interleaved({"ours": lambda: ours.run(tokens), "transformers+numpy": lambda: ref.run(tokens)},
                             repeats)
  return {"size": os.path.basename(checkpoint) or size, "num_layers": config.model.num_layers,
          "d_model": config.model.d_model,
          "num_heads": config.model.num_heads, "seq_len": t, "num_sequences": num, "batch_size": batch_size,
          "max_abs_diff": max_diff, "tokens_per_s": {k: num * t / common.median(v) for k, v in times.items()},
          "seconds": times}


def child(side: str, size: str, num: int, seq_len: int, batch_size: int) -> None:
  """One memory point: print ``{"setup_rss", "peak_rss"}`` (bytes) for ``side`` on ``num`` sequences."""
  torch.set_num_threads(os.cpu_count())
  with tempfile.TemporaryDirectory() as workdir:
    config, model, hf_model = build(size, seq_len, workdir)
    tokens = sequences(num, seq_len, config.model.vocab_size)
    setup = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if side == "ours":
      OursPass(model, tokens, batch_size).run(tokens)
    else:
      HFPass(hf_model, seq_len, batch_size).run(tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print(json.dumps({"setup_rss": setup, "peak_rss": peak}))


def timed_child(side: str, checkpoint: str, num: int, seq_len: int, batch_size: int, repeats: int,
                means_file: str) -> None:
  """One side of ``--hf``: a first pass (compiles; its per-query means go to ``means_file``), then ``repeats``
  timed passes; prints ``{"seconds": [...], "peak_rss": bytes}``."""
  torch.set_num_threads(os.cpu_count())
  with tempfile.TemporaryDirectory() as workdir:
    config, model, hf_model = build("", seq_len, workdir, checkpoint)
    tokens = sequences(num, seq_len, config.model.vocab_size)
    if side == "ours":
      del hf_model
      ours = OursPass(model, tokens, batch_size)
      run, means = lambda: ours.run(tokens), ours.means
    else:
      del model
      ref = HFPass(hf_model, seq_len, batch_size)
      run, means = lambda: ref.run(tokens), lambda r: r.means()
    np.savez(means_file, **{k: np.asarray(v) for k, v in means(run()).items()})
    seconds = common.interleaved({side: run}, repeats)[side]
  print(json.dumps({"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def bench_checkpoint(checkpoint: str, num: int, repeats: int, batch_size: int, seq_len: int, workdir: str) -> dict:
  """``--hf``: each side in its own subprocess (:func:`timed_child`), their means compared here."""
  out, means = {}, {}
  for side in ("ours", "transformers+numpy"):
    means_file = os.path.join(workdir, f"{side}.npz")
    cmd = [sys.executable, "-m", "benchmarks.analysis_throughput", f"--child={side}", f"--hf={checkpoint}",
           f"--num_sequences={num}", f"--seq_len={seq_len}", f"--batch_size={batch_size}",
           f"--repeats={repeats}", f"--means_file={means_file}"]
    out[side] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    means[side] = dict(np.load(means_file))
  worst = max(float(np.max(np.abs(means["ours"][q] - means["transformers+numpy"][q])))
              for q in ("log_z", "entropy", "max_weight", "sink_mass"))
  if worst > 1e-3:
    raise AssertionError(f"{checkpoint}: ours and the transformers reference disagree by {worst}")
  config = hf.Checkpoint(checkpoint).config(seq_len)
  return {"size": os.path.basename(checkpoint), "num_layers": config.model.num_layers,
          "d_model": config.model.d_model, "num_heads": config.model.num_heads, "seq_len": seq_len,
          "num_sequences": num, "batch_size": batch_size, "max_abs_diff": worst,
          "tokens_per_s": {k: num * seq_len / common.median(v["seconds"]) for k, v in out.items()},
          "seconds": {k: v["seconds"] for k, v in out.items()},
          "peak_rss_gib": {k: v["peak_rss"] / 2**30 for k, v in out.items()}}


def memory(size: str, batch_size: int, nums: list[int], lens: list[int]) -> list[dict]:
  points = [(n, SIZES[size][3]) for n in nums] + [(nums[0], t) for t in lens if t != SIZES[size][3]]
  rows = []
  for n, t in points:
    row = {"size": size, "num_sequences": n, "seq_len": t}
    for side in ("ours", "transformers+numpy"):
      cmd = [sys.executable, "-m", "benchmarks.analysis_throughput", f"--child={side}", f"--sizes={size}",
             f"--num_sequences={n}", f"--seq_len={t}", f"--batch_size={batch_size}"]
      out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
      r = json.loads(out)
      row[side] = {"growth_mb": (r["peak_rss"] - r["setup_rss"]) / 2**20, "peak_mb": r["peak_rss"] / 2**20}
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes", default="tiny,medium", help=f"comma-separated, from {sorted(SIZES)}")
  p.add_argument("--num_sequences", type=int, default=128)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--memory", action="store_true", help="peak-RSS growth against sequences and seq_len instead")
  p.add_argument("--memory_sequences", default="32,128,512")
  p.add_argument("--memory_seq_lens", default="128,256,512")
  p.add_argument("--json", default="", help="write every measurement here")
  p.add_argument("--child", default="", help=argparse.SUPPRESS)
  p.add_argument("--hf", default="", help="a local checkpoint (HF directory or GGUF file) instead of --sizes")
  p.add_argument("--seq_len", type=int, default=0, help="with --hf: the sequence length (default 1024)")
  p.add_argument("--means_file", default="", help=argparse.SUPPRESS)
  args = p.parse_args()
  sizes = [] if args.hf else args.sizes.split(",")
  for s in sizes:
    if s not in SIZES:
      raise SystemExit(f"--sizes: unknown size {s!r}; choose from {sorted(SIZES)}")
  if args.hf and args.memory:
    raise SystemExit("--hf times the two passes; --memory runs the random --sizes only")
  if args.child and args.hf:
    return timed_child(args.child, args.hf, args.num_sequences, args.seq_len, args.batch_size, args.repeats,
                       args.means_file)
  if args.child:
    return child(args.child, sizes[0], args.num_sequences, args.seq_len, args.batch_size)
  torch.set_num_threads(os.cpu_count())
  record = {"machine": common.machine(), "results": []}
  if args.memory:
    nums = [int(x) for x in args.memory_sequences.split(",")]
    lens = [int(x) for x in args.memory_seq_lens.split(",")]
    for s in sizes:
      record["results"] += memory(s, args.batch_size, nums, lens)
    rows = [[r["size"], r["num_sequences"], r["seq_len"], r["ours"]["growth_mb"],
             r["transformers+numpy"]["growth_mb"], r["ours"]["peak_mb"], r["transformers+numpy"]["peak_mb"]]
            for r in record["results"]]
    header = ["size", "sequences", "seq_len", "ours growth MB", "reference growth MB", "ours peak MB",
              "reference peak MB"]
  else:
    with tempfile.TemporaryDirectory() as workdir:
      for s in sizes:
        record["results"].append(bench_size(s, args.num_sequences, args.repeats, args.batch_size, workdir))
      if args.hf:
        record["results"].append(bench_checkpoint(args.hf, args.num_sequences, args.repeats, args.batch_size,
                                                  args.seq_len or 1024, workdir))
    rows = [[r["size"], f'{r["num_layers"]}x{r["d_model"]}, T={r["seq_len"]}, N={r["num_sequences"]}',
             r["tokens_per_s"]["ours"], r["tokens_per_s"]["transformers+numpy"],
             f'{r["tokens_per_s"]["ours"] / r["tokens_per_s"]["transformers+numpy"]:.2f}', f'{r["max_abs_diff"]:.1e}']
            for r in record["results"]]
    header = ["size", "shape", "ours tok/s", "transformers+NumPy tok/s", "ours / reference", "max |diff|"]
    if args.hf:
      rows = [r + [" / ".join(f"{x:.1f}" for x in record["results"][-1]["peak_rss_gib"].values())] for r in rows]
      header.append("peak RSS GiB (ours / reference)")
  record["machine_after"] = {"load_avg": [round(x, 2) for x in os.getloadavg()]}
  print(f'machine: {record["machine"]}')
  print(common.markdown_table(header, rows))
  print(f'load average before {record["machine"]["load_avg"]}, after {record["machine_after"]["load_avg"]}')
  common.write_json(args.json, record)


if __name__ == "__main__":
  main()
