"""Numerical kernels shared by models and objectives (no distribution code, no model state)."""
