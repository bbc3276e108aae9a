"""Estimators of absolute-position leakage (sufficient-statistic accumulators)."""
