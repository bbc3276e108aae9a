"""The passes over a model: jitted steps that run one forward through the hook points and fold it into the
estimators' accumulators (``steps``), per-layer views of those accumulators (``accumulators``), the edits the
interventions make (``edits``) and the batch size a memory budget allows (``memory``)."""
