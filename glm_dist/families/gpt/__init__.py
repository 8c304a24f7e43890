"""The gpt family -- GPT-2 / GPT-3, the pre-LN decoder.

Its files: spec.py (its registry row), model.py (config, flavors, modules), hf.py (transformers
adapter), pipeline.py (its layers as pipeline stages).

How a family is laid out: docs/adding-a-family.md.
"""
