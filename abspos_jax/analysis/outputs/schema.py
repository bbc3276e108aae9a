"""summary.json: its version, the key paths other modules read, and the helpers that write its values.

Every estimator module writes its own section (``denominators.summarize``,
``leakage.summarize``, ``position0.summarize``, ``sinks.summarize``,
``probes.summarize``, ``effects.run``); this module holds what
the readers share: ``--compare`` (``compare.METRICS``), the family summary
(``family.LAYER_KEYS``), ``report.md``, ``steps.json`` (``curves.step_record``),
the sweep's skip logic (``sweep.state.analysed_step``) and the training-time
hook's metric names (:data:`HOOK_METRICS`). A number keeps one name per layer
of the code, and this table says which names are the same number.

An interval sits beside its value as ``<key>_ci``: ``[lo, hi]``, nested per
element for per-layer lists; ``None`` for a NaN or infinite value.
"""

from typing import Any

import numpy as np

# summary.json's "estimators": a summary written by older estimators has other keys and numbers, and the
# sweep analyses such a run again.
ESTIMATORS = "v2"

STEP = ("meta", "step")
POSITION = ("position",)  # the model's position scheme
NUM_LAYERS = ("num_layers",)
NUM_HEADS = ("num_heads",)
MAIN_POLICY = ("main_policy",)
NUM_SEQUENCES = ("num_sequences",)  # per BOS policy
SEQ_LEN = ("seq_len",)
INTERVALS = ("intervals",)  # level, method, num_blocks, nonempty_blocks
LOSS = ("loss",)  # per BOS policy
LEAKAGE = ("leakage",)  # leakage.summarize
LEAKAGE_LOG_WEIGHTS = ("leakage", "log_weights_overall")
PROBES = ("probes",)  # probes.summarize
POSITION0 = ("position0",)  # position0.summarize: norm, norm_ratio, cos_prev per depth
CLOSEDNESS = ("closedness_max_abs_diff",)
COMPONENTS = ("components",)
POOLED = ("components", "pooled")  # causal_mask, residual_stream, leakage_share (+ _var, _ci)
POOLED_EARLY = ("components", "pooled_early")
CAUSAL_MASK_LAYER = ("components", "causal_mask")
RESIDUAL_STREAM_LAYER = ("components", "residual_stream")
CAUSAL_MASK_LAYER_EARLY = ("components", "causal_mask_early")
RESIDUAL_STREAM_LAYER_EARLY = ("components", "residual_stream_early")
POS0_NORM_RATIO = ("position0", "norm_ratio")  # [layer + 1], embedding output first
FINGERPRINT = ("fingerprint",)
FINGERPRINT_BOS = ("fingerprint", "bos")
FINGERPRINT_NO_BOS = ("fingerprint", "no_bos")
DENOMINATORS = ("denominators",)  # per-layer means, each with ``_ci`` (``denominators.LAYER_MEANS``)
SINK_RATE = ("sink_rate",)  # [layer]
SINK_SCORE_MAX = ("sink_score_max",)
SINK_SCORE_MAX_LAYER = ("sink_score_max_layer",)
SINK_HEADS = ("sink_heads",)  # [[layer, head], ...]
INTERVENTIONS = ("interventions",)
BOS_REPLACE = ("interventions", "bos_replace")  # per replacement kind
# The entries under INTERVENTIONS (``effects.registry``), as dotted paths.
INTERVENTION_NAMES = ("bos_replace.mean", "bos_replace.token", "bos_replace.zeros", "bos_replace.random",
                      "pos0_patch", "sink_ablate")

def intervention_rows(iv: dict) -> list[tuple[str, dict]]:
  """``(label, entry)`` of every intervention of summary.json's ``interventions`` that ran (``bos_replace``
  kinds as ``bos_replace[kind]``, ``pos0_patch``, ``sink_ablate``), in that order."""
  rows = [(f"bos_replace[{k}]", v) for k, v in iv.get("bos_replace", {}).items() if isinstance(v, dict)]
  return rows + [(k, iv[k]) for k in ("pos0_patch", "sink_ablate") if isinstance(iv.get(k), dict)]


# The emergence hook's metrics.jsonl keys, the summary.json path of the same number, and the key of
# ``leakage.finalize`` / ``sinks.sink_statistics`` it comes from (the hook logs per-layer lists as ``_l{l}``).
HOOK_METRICS = {
    "sink_rate": (SINK_RATE, "sinks.sink_rate"),
    "sink_score_max": (SINK_SCORE_MAX, "sinks.sink_score_max"),
    "pos0_norm_ratio": (POS0_NORM_RATIO, "position0.pos0_norm_ratio"),
    "leakage_log_weights": (LEAKAGE_LOG_WEIGHTS, "leakage.leakage_loga_overall"),
    "causal_mask_share": (POOLED + ("causal_mask",), "leakage.share_mask_overall"),
    "residual_stream_share": (POOLED + ("residual_stream",), "leakage.share_res_overall"),
    "causal_mask_share_early": (POOLED_EARLY + ("causal_mask",), "leakage.early_share_mask_overall"),
    "residual_stream_share_early": (POOLED_EARLY + ("residual_stream",), "leakage.early_share_res_overall"),
}


def get(summary: dict, path: tuple, default: Any = None) -> Any:
  """``summary[path[0]][path[1]]...``; list indices allowed; ``default`` where a key is missing."""
  x = summary
  for key in path:
    try:
      x = x[key]
    except (KeyError, IndexError, TypeError):
      return default
  return x


def interval(summary: dict, path: tuple) -> Any:
  """The ``[lo, hi]`` kept beside the value at ``path`` (its ``<key>_ci`` sibling), else None."""
  return get(summary, (*path[:-1], path[-1] + "_ci"))


def tolist(x: Any) -> Any:
  """JSON-ready: arrays to nested lists of floats, NaN and infinities to None."""
  a = np.asarray(x, dtype=np.float64)
  if a.ndim == 0:
    return float(a) if np.isfinite(a) else None
  return [tolist(v) for v in a]


def ci_pair(ci: dict, key: str) -> Any:
  """``[lo, hi]`` (nested per element for arrays) of ``key`` in an ``intervals.summarize`` result."""
  return tolist(np.stack([ci["lo"][key], ci["hi"][key]], -1))


def with_ci(ci: dict, key: str, name: str) -> dict:
  """``{name: value, name + "_ci": [lo, hi]}`` of ``key`` in an ``intervals.summarize`` result."""
  return {name: tolist(ci["value"][key]), name + "_ci": ci_pair(ci, key)}
