"""The fixed-effects design and solve at long context: time, and accuracy against float64.

    python -m benchmarks.fixed_effects_solve [--seq_lens=1024,2048,8192] [--window=256] [--check_up_to=2048]

For each length ``T``: ``fixed_effects.make_design`` of a stack of three
masks (causal, causal, sliding window ``--window``: a local/global model's
layers), then ``fit_two_way`` jitted and timed after its compilation, on the
per-offset and per-query sums of random logits with a query effect and an
offset effect. Up to ``--check_up_to`` tokens the coefficients are compared
with a float64 least-squares solve of the same normal equations (dense,
``O(T^3)``): the error is reported relative to the coefficients' size.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from abspos_jax.analysis.estimators import fixed_effects as fe


def _mask(t: int, window: int | None = None) -> np.ndarray:
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  return (j <= i) if window is None else (j <= i) & (j > i - window)


def _sums(vis: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  t = vis.shape[0]
  x = rng.normal(size=(t, t)) + 2.0 * rng.normal(size=(t, 1)) + np.log1p(np.arange(t))[None, :]
  i, j = np.nonzero(vis)
  return np.bincount(i - j, x[i, j], minlength=t), np.where(vis, x, 0.0).sum(1)


def _float64_solve(vis: np.ndarray, offsets: np.ndarray, queries: np.ndarray) -> np.ndarray:
  t = vis.shape[0]
  i, j = np.nonzero(vis)
  s = np.zeros((t, t))
  s[i, i - j] = 1.0
  gram = np.block([[np.diag(s.sum(0)), s.T], [s, np.diag(s.sum(1))]])
  return np.linalg.lstsq(gram, np.concatenate([offsets, queries]), rcond=1e-10)[0]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_lens", default="1024,2048,8192")
  parser.add_argument("--window", type=int, default=256)
  parser.add_argument("--check_up_to", type=int, default=2048)
  args = parser.parse_args()
  fit = jax.jit(fe.fit_two_way)
  for t in (int(x) for x in args.seq_lens.split(",")):
    masks = np.stack([_mask(t), _mask(t), _mask(t, args.window)])
    start = time.perf_counter()
    design = fe.make_design(masks)
    design_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    sums = [_sums(m, rng) for m in masks]
    offsets = jnp.asarray(np.stack([o for o, _ in sums]), jnp.float32)
    queries = jnp.asarray(np.stack([q for _, q in sums]), jnp.float32)
    coef = jax.block_until_ready(fit(design, offsets, queries))
    start = time.perf_counter()
    jax.block_until_ready(fit(design, offsets, queries))
    solve_ms = (time.perf_counter() - start) * 1e3
    row = {"seq_len": t, "masks": len(masks), "design_s": round(design_s, 2), "solve_ms": round(solve_ms, 1)}
    if t <= args.check_up_to:
      errors = [np.abs(np.asarray(c) - ref).max() / np.abs(ref).max()
                for c, ref in zip(coef, (_float64_solve(m, o, q) for m, (o, q) in zip(masks, sums)))]
      row["max_relative_error"] = float(f"{max(errors):.1e}")
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()
