"""The gpt1 family -- GPT-1 (Radford et al. 2018): GPT's decoder with post_ln=True.

Its files: spec.py (its registry row), model.py (its flavors), hf.py (transformers
adapter).

How a family is laid out: docs/adding-a-family.md.
"""
