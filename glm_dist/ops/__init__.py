"""Numerical kernels shared by models and objectives, and what the device computes natively
(``hardware.py``); no distribution code, no model state, no config."""
