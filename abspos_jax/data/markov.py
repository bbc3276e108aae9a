"""Seeded sampling pieces shared by the synthetic languages.

Both ``synthetic`` (a Markov chain over words) and ``backcopy`` (a Markov
chain over byte symbols) build their chain the same way: a Zipf unigram over
``n`` items, ``branching`` distinct successors per item drawn from that
unigram, and successor ``k`` taken with probability ``∝ 1 / (k + 1)``. All
randomness comes from numpy ``Generator`` s; a document's generator depends on
the language seed, the split and the document index only.
"""

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

SPLIT_CODES = {"train": 1, "validation": 2}  # 0 is the stream that builds the language itself


def zipf_weights(n: int, exponent: float) -> np.ndarray:
  """Probabilities ``w[r] ∝ (r + 1) ** -exponent`` for ``r < n``.

  Returns:
    float64 `[n]`, summing to 1.
  """
  w = np.arange(1, n + 1, dtype=np.float64) ** -exponent
  return w / w.sum()


def successor_weights(branching: int) -> np.ndarray:
  """Probabilities ``q[k] ∝ 1 / (k + 1)`` of taking successor ``k``.

  Returns:
    float64 `[branching]`, summing to 1.
  """
  return zipf_weights(branching, 1.0)


def successor_table(rng: np.random.Generator, unigram: np.ndarray, branching: int) -> np.ndarray:
  """For each of the ``n = len(unigram)`` items, ``branching`` distinct successors.

  Row ``i`` is drawn without replacement from ``unigram`` (items may follow
  themselves), one ``rng.choice`` per row in row order.

  Returns:
    int `[n, branching]`.
  """
  n = len(unigram)
  return np.stack([rng.choice(n, size=branching, replace=False, p=unigram) for _ in range(n)])


def sample(cdf: np.ndarray, u: np.ndarray | float) -> np.ndarray:
  """Inverse-CDF sampling: the index ``i`` with ``cdf[i-1] <= u < cdf[i]`` for uniform ``u``.

  Args:
    cdf: `[n]` cumulative probabilities (last entry 1 up to round-off).
    u: uniforms in [0, 1), any shape.

  Returns:
    int indices in ``0..n-1``, the shape of ``u``.
  """
  # The clip guards against float round-off at the top.
  return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


def entropy(p: np.ndarray) -> float:
  """Shannon entropy ``-Σ p log p`` in nats (``0 log 0 = 0``) of a distribution ``p``."""
  p = np.asarray(p, np.float64)
  nz = p[p > 0]
  return float(-(nz * np.log(nz)).sum())


def document_rng(seed: int, split: str, index: int) -> np.random.Generator:
  """The generator of document `index` of `split`; splits never share a stream."""
  if split not in SPLIT_CODES:
    raise ValueError(f"synthetic split must be one of {sorted(SPLIT_CODES)}, got {split!r}")
  return np.random.default_rng([seed, SPLIT_CODES[split], index])


def params_rng(params: Any, split: str, index: int) -> np.random.Generator:
  """:func:`document_rng` of a language's parameters (anything with a ``seed``): the generator of its document
  ``index`` of ``split``."""
  return document_rng(params.seed, split, index)


def split_texts(generate: Callable[[np.random.Generator, Any], str], params: Any, split: str,
                num_docs: int) -> Iterator[str]:
  """The ``num_docs`` documents ``generate(params_rng(params, split, i), params)`` of ``split``, in index order."""
  for i in range(num_docs):
    yield generate(params_rng(params, split, i), params)
