"""The estimators on constructed models whose answer is known: the numbers of docs/estimators.md.

    python -m benchmarks.estimator_cases

Prints one line per case of the issue "Estimators v2" (the v1 numbers beside
them are those measured before the rewrite) with the v2 estimate and its 95%
jackknife interval. Every case runs through the public API
(:func:`abspos_jax.analysis.analyze`) or the estimator modules directly.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import scipy.special

from abspos_jax import model as model_lib
from abspos_jax.analysis import AnalysisOptions, analyze
from abspos_jax.analysis.estimators import fixed_effects as fe, intervals, leakage, sinks
from abspos_jax.config import base_config

FAST = AnalysisOptions(batch_size=8, interventions=False, progress=False)


def small(num_layers: int = 2, **model) -> model_lib.Decoder:
  c = base_config()
  c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.window = num_layers, 32, 4, 4
  c.data.seq_len = 16
  for k, v in model.items():
    c.model[k] = v
  return model_lib.create(c)


def zero_qk(m: model_lib.Decoder) -> model_lib.Decoder:
  for block in m.blocks:
    block.attn.wq[...] = jnp.zeros_like(block.attn.wq[...])
    block.attn.wk[...] = jnp.zeros_like(block.attn.wk[...])
  return m


def tokens(n: int = 16, t: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
  none = np.random.default_rng(seed).integers(0, 256, (n, t)).astype(np.int32)
  prepend = none.copy()
  prepend[:, 0] = 1
  return {"prepend": prepend, "none": none}


def direct(profile: np.ndarray, n: int, noise: float, seed: int) -> dict:
  """v2 pooled shares with intervals for logits ``profile + noise`` (one layer, two heads, 16 blocks)."""
  t = profile.shape[-1]
  vis = np.tri(t, dtype=bool)
  s = profile + noise * np.random.default_rng(seed).normal(size=(n, 1, 2, t, t))
  s = np.where(vis, s, -np.inf).astype(np.float32)
  lz = scipy.special.logsumexp(s, -1).astype(np.float32)
  design = fe.make_design(vis)
  acc, *_ = jax.jit(leakage.update)(leakage.init(1, 2, t, 16), jnp.asarray(s), jnp.asarray(lz), jnp.arange(n), design)
  keys = ("share_res_overall", "share_mask_overall")
  stacked = jax.jit(lambda a: intervals.evaluate(
      lambda k: {x: leakage.finalize(a, design, k)[x] for x in keys}, 16))(acc)
  return intervals.summarize(stacked, np.asarray(acc["n"]))


def fmt(ci: dict, key: str) -> str:
  return f"{float(ci['value'][key]):+.4f} [{float(ci['lo'][key]):+.4f}, {float(ci['hi'][key]):+.4f}]"


def main() -> None:
  rows = []
  for std, before in ((0.1, 0.21), (0.3, 0.78)):
    c = analyze(small(1, init_std=std), {"none": np.full((16, 16), 65, np.int32)}, main="none",
                options=FAST).summary["components"]["pooled"]
    rows.append((f"1. repeated token, no BOS, 1-layer RoPE, init_std {std}: residual share", before,
                 f"{c['residual_stream']:+.2e} [{c['residual_stream_ci'][0]:+.2e}, {c['residual_stream_ci'][1]:+.2e}]"))
  i, j = np.arange(64)[:, None], np.arange(64)[None, :]
  for cval, before in ((0.1, -0.93), (0.5, -4.5), (2.0, -23.6)):
    rows.append((f"1. logits -{cval}*(i-j): residual share", before,
                 fmt(direct(-cval * (i - j).astype(float), 16, 0.0, 0), "share_res_overall")))
  sa = analyze(zero_qk(small()), tokens(), options=AnalysisOptions(batch_size=8, progress=False)
               ).summary["interventions"]["sink_ablate"]
  rows.append(("2. sink_ablate on zero query weights: residual_stream_removed", 0.25,
               f"{sa['residual_stream_removed']} (change {sa['residual_stream_change']:+.1e} nats^2)"))
  rows.append(("2. ... causal_mask change (nats^2; one key fewer in each ablated head)", -0.023,
               f"{sa['causal_mask_change']:+.4f} {sa['causal_mask_change_ci']}"))
  t, w = 128, 32
  vis = np.tri(t, dtype=bool) & (np.arange(t)[None, :] > np.arange(t)[:, None] - w)
  mass = np.zeros((2, 1, 1, t), np.float32)
  mass[..., :w] = 1.0  # a perfect sink: all weight on key 0 while it is visible
  score = float(sinks.sink_statistics(jnp.asarray(mass), jnp.asarray(vis))["sink_score"][0, 0])
  rows.append(("3. perfect sink under a 32-key window, T = 128: sink score", round((w - 4) / (t - 4), 3),
               f"{score:.3f}"))
  i, j = np.arange(32)[:, None], np.arange(32)[None, :]
  for n, before in ((8, -0.31), (16, -1.17), (64, -1.65), (256, -1.95)):
    rows.append((f"4. offset profile -0.3*(i-j) + noise sd 1, {n} sequences: residual share", before,
                 fmt(direct(-0.3 * (i - j).astype(float), n, 1.0, n), "share_res_overall")))
  r = analyze(zero_qk(small()), tokens(), options=FAST).summary["probes"]
  rows.append(("6. attention-feature probe on zero query weights: R^2 (raw features / mask removed)", 1.0,
               f"{min(r['attention_raw_r2']):.4f} / {max(r['attention_r2']):.2e}"))
  width = max(len(r[0]) for r in rows)
  print(f"{'case'.ljust(width)} | v1 | v2 [95% interval]")
  for name, before, after in rows:
    print(f"{name.ljust(width)} | {before} | {after}")
  print(json.dumps({"rows": [{"case": r[0], "v1": r[1], "v2": r[2]} for r in rows]}))


if __name__ == "__main__":
  main()
