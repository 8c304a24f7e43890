"""The xlnet family -- XLNet (Yang et al. 2019), Transformer-XL trained by permutation LM.

Its files: spec.py (its registry row), model.py (config, flavors, modules), hf.py (transformers
adapter).

How a family is laid out: docs/adding-a-family.md.
"""
