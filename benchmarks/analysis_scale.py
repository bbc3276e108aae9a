"""Analysis at research scale: tokens/s and peak memory of the analysis against a plain jitted forward.

    python -m benchmarks.analysis_scale [--shape=12x768x12 | --hf=CHECKPOINT] [--seq_lens=256,1024,2048]
                                        [--num_sequences=2] [--end_to_end]

``--shape`` is layers x d_model x heads, or ``tiny`` / ``medium``
(``benchmarks.train_throughput.SIZES``); ``--hf`` a local checkpoint (a Hugging
Face directory or a GGUF file) instead of the random model. For each seq_len,
fresh subprocesses on the same decoder (the random RoPE one is seeded): one
times a plain jitted
forward (``model(tokens)``, the training path), one the analysis pass's
baseline step (``steps.make_baseline_step``, what ``analyze`` runs per batch
with interventions off) at the batch size and query block ``analyze``
chooses from its memory budget (``analysis.passes.memory``, with its cap on
one block's logits), the batch capped at ``--num_sequences``. Both are
compiled and warmed up first, then timed over ``--num_sequences`` sequences
(median of ``--repeats``). With ``--end_to_end`` a third one times what a
user waits for: ``analyze`` on ``--num_sequences`` sequences under both BOS
policies, interventions off, from the call to its result (compilation, the
memory budget's compilations, both sweeps, finalisation and jackknife), in
tokens per second over every token it analyses (both policies' sequences,
``e2e tok/s``: a plain forward "over the same tokens" would read both) and
over the main policy's tokens alone (``main tok/s``).

The analysis is timed in its steady state: on sequences past the first
``AnalysisOptions.closedness_sequences``, the batches a sweep of hundreds of
sequences is made of. The closedness check, which only the batch holding the
sweep's first sequences runs (two forwards of those sequences), is a fixed
cost per sweep and is reported on its own (``closedness s``: that batch's time
minus a steady batch's). Peak RSS is the subprocess's maximum resident set
(``ru_maxrss``), imports and model included.
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from abspos_jax import model as model_lib
from abspos_jax import variants
from abspos_jax.analysis import analyze
from abspos_jax.analysis.passes import steps, memory
from abspos_jax.analysis.estimators import fixed_effects
from abspos_jax.analysis.options import AnalysisOptions
from abspos_jax.analysis.core import fingerprint_groups, layer_visible
from benchmarks import common
from benchmarks.scaling import best_ms
from benchmarks.train_throughput import SIZES, size_config


def _model(shape: str, seq_len: int, hf: str = "", rope_scale: str = ""):
  if hf:
    from abspos_jax.interop.hf.files import Checkpoint
    ckpt = Checkpoint(hf)
    variant = variants.Variant(ntk_alpha=variants.parse_rope_scale(rope_scale or None))
    config = ckpt.config(seq_len, context_scale=variant.context_scale())
    model = ckpt.model(config)
    return variants.rebuild(model, variants.apply(config, variant)) if variant else model
  layers, d_model, heads = SIZES[shape][:3] if shape in SIZES else (int(x) for x in shape.split("x"))
  return model_lib.create(size_config(layers, d_model, heads, seq_len, 1), seed=0)


def child(kind: str, shape: str, seq_len: int, num_sequences: int, repeats: int, hf: str = "",
          rope_scale: str = "") -> dict:
  """One measurement in this process: ``kind`` is ``forward``, ``analysis`` or ``analyze``."""
  m = _model(shape, seq_len, hf, rope_scale)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (num_sequences, seq_len)), jnp.int32)
  graphdef, params = nnx.split(m, nnx.Param)
  out = {"kind": kind, "shape": hf or shape, "seq_len": seq_len, "num_sequences": num_sequences}
  if kind == "analyze":
    seqs = {"prepend": np.asarray(tokens), "none": np.roll(np.asarray(tokens), 1, axis=1)}
    t0 = time.perf_counter()
    result = analyze(m, seqs, options=AnalysisOptions(interventions=False, progress=False))
    seconds = time.perf_counter() - t0
    out.update(batch=result.summary["batch_size"], query_block=result.summary["memory"]["query_block"],
               seconds=seconds, tokens_per_s=num_sequences * seq_len / seconds,
               all_tokens_per_s=sum(t.size for t in seqs.values()) / seconds,
               peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / memory.GiB)
    return out
  if kind == "forward":
    fwd = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
    seconds = best_ms(lambda: fwd(params, tokens), repeats) / 1e3
    batch = num_sequences
  else:
    design = fixed_effects.make_design(layer_visible(m.spec, seq_len))
    # One fingerprint group per first token, as analyze() groups them (one per vocabulary entry would hold
    # SmolLM2's [49,152, L + 1, d_model] sums).
    num_groups, x0_groups = fingerprint_groups({"tokens": np.asarray(tokens)}, m.spec.vocab_size)
    acc = steps.init_accumulators(m.spec, seq_len, {}, AnalysisOptions().num_blocks, num_groups)
    budget = memory.available_bytes() // 2
    step_for = {b: jax.jit(steps.make_baseline_step(graphdef, design, {}, jnp.asarray(x0_groups),
                                                    query_block=None if b == seq_len else b),
                           donate_argnums=1) for b in memory.query_blocks(seq_len)}
    batch, block, used = memory.choose_batch_and_block(
        lambda b, block: step_for[block].lower(params, acc, jax.ShapeDtypeStruct((b, seq_len), jnp.int32),
                                               jax.ShapeDtypeStruct((b,), jnp.int32)).compile(),
        num_sequences, budget, memory.query_blocks(seq_len), m.spec.num_heads, seq_len)
    step = step_for[block]
    out.update(step_gib=used / memory.GiB, budget_gib=budget / memory.GiB, query_block=block)

    steady = AnalysisOptions().closedness_sequences  # the first sequence id whose batch skips the check

    def timed(first_id: int, count: int) -> float:
      """Median seconds of ``count`` sequences from ``first_id`` on, after a warm-up; the accumulators
      (which the step donates) are copied before the clock starts: analyze copies them once per sweep."""
      times = []
      for _ in range(repeats + 1):
        a = jax.block_until_ready(jax.tree.map(jnp.copy, acc))
        t0 = time.perf_counter()
        for start in range(0, count, batch):
          stop = min(start + batch, count)
          a = step(params, a, tokens[start:stop], jnp.arange(first_id + start, first_id + stop))
        jax.block_until_ready(a)
        times.append(time.perf_counter() - t0)
      return common.median(times[1:])

    seconds = timed(steady, num_sequences)
    out["closedness_s"] = timed(0, batch) - timed(steady, batch)
  out.update(batch=batch, seconds=seconds, tokens_per_s=num_sequences * seq_len / seconds,
             peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / memory.GiB)
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", default="12x768x12", help=f"layers x d_model x heads, or one of {sorted(SIZES)}")
  p.add_argument("--seq_lens", default="256,1024,2048")
  p.add_argument("--num_sequences", type=int, default=2)
  p.add_argument("--repeats", type=int, default=1)
  p.add_argument("--hf", default="", help="a local checkpoint (HF directory or GGUF file) instead of --shape")
  p.add_argument("--rope_scale", default="", help="with --hf: ntk:ALPHA, the NTK variant (to pass the trained "
                 "context, up to ALPHA times it)")
  p.add_argument("--end_to_end", action="store_true", help="also time analyze() end to end")
  p.add_argument("--json", default="")
  p.add_argument("--child", default="", help=argparse.SUPPRESS)
  a = p.parse_args()
  if a.child:
    kind, seq_len = a.child.split(":")
    print(json.dumps(child(kind, a.shape, int(seq_len), a.num_sequences, a.repeats, a.hf, a.rope_scale)))
    return
  record = {"machine": common.machine(), "rows": []}
  rows = []
  for seq_len in (int(x) for x in a.seq_lens.split(",")):
    got = {}
    for kind in ("forward", "analysis") + (("analyze",) if a.end_to_end else ()):
      r = subprocess.run([sys.executable, "-m", "benchmarks.analysis_scale", f"--shape={a.shape}", f"--hf={a.hf}", f"--rope_scale={a.rope_scale}",
                          f"--num_sequences={a.num_sequences}", f"--repeats={a.repeats}",
                          f"--child={kind}:{seq_len}"], capture_output=True, text=True)
      if r.returncode:
        got[kind] = {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
      else:
        got[kind] = json.loads(r.stdout.strip().splitlines()[-1])
      print(kind, seq_len, got[kind], flush=True)
    record["rows"].append(got)
    rows.append(_row(seq_len, got, a.end_to_end))
  print(f"machine: {record['machine']}")
  print(common.markdown_table(["seq_len", "forward tok/s", "analysis tok/s", "analysis / forward",
                               "batch x query block", "closedness s (once per sweep)",
                               "peak RSS GiB (forward / analysis)"]
                              + (["e2e tok/s (both policies)", "e2e / forward", "main tok/s", "main / forward", "e2e s",
                                  "e2e peak RSS GiB"] if a.end_to_end else []),
                              rows))
  if a.json:
    with open(a.json, "w") as fh:
      json.dump(record, fh, indent=1)


def _row(seq_len: int, got: dict, end_to_end: bool) -> list:
  """One table row from the children's records (an error in place of the numbers it prevents)."""
  f, an = got["forward"], got["analysis"]
  if "error" in f or "error" in an:
    row = [seq_len, f.get("tokens_per_s", f.get("error")), an.get("tokens_per_s", an.get("error")), "", "", "", ""]
  else:
    row = [seq_len, round(f["tokens_per_s"]), round(an["tokens_per_s"]),
           round(an["tokens_per_s"] / f["tokens_per_s"], 2),
           f"{an['batch']} x {an['query_block']}", f"{an['closedness_s']:.1f}",
           f"{f['peak_rss_gib']:.1f} / {an['peak_rss_gib']:.1f}"]
  if end_to_end:
    e = got["analyze"]
    if "error" in e or "error" in f:
      row += [e.get("error", ""), "", "", "", "", ""]
    else:
      row += [round(e["all_tokens_per_s"]), round(e["all_tokens_per_s"] / f["tokens_per_s"], 2),
              round(e["tokens_per_s"]), round(e["tokens_per_s"] / f["tokens_per_s"], 2), f"{e['seconds']:.0f}",
              f"{e['peak_rss_gib']:.1f}"]
  return row


if __name__ == "__main__":
  main()
