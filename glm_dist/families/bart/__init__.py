"""The bart family -- BART (Lewis et al. 2019), the denoising encoder-decoder.

Its files: spec.py (its registry row), model.py (config, flavors, modules), hf.py (transformers
adapter).

How a family is laid out: docs/adding-a-family.md.
"""
