"""The bert family -- the bidirectional encoders: BERT, RoBERTa, ALBERT and ELECTRA (one row each).

Its files: spec.py (its registry row), model.py (config, flavors, modules), hf.py (transformers
adapter), pipeline.py (its layers as pipeline stages).

How a family is laid out: docs/adding-a-family.md.
"""
