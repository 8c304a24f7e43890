"""The t5 family -- T5 (Raffel et al. 2019), the text-to-text encoder-decoder.

Its files: spec.py (its registry row), model.py (config, flavors, modules), hf.py (transformers
adapter).

How a family is laid out: docs/adding-a-family.md.
"""
