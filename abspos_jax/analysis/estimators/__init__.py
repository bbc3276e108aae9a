"""The estimators: each turns sums accumulated over sequences into one kind of result (docs/estimators.md).

``denominators`` (per-query log Z, excess, entropy, sink mass; slope of log Z
on log|V(i)|), ``fixed_effects`` (the two-way query x offset design),
``leakage`` (held-out leakage and its causal-mask / residual-stream
components), ``position0`` (norms, trajectory, fingerprint, closedness),
``sinks`` (sink-reading heads, held out), ``probes`` (ridge probes of
log-position), ``intervals`` (the delete-one-block jackknife), ``effects``
(each intervention's effect on the components).
"""
