"""The awd_lstm family: its registry row (spec.py), model (model.py) and, where it exports, its
transformers adapter (hf.py)."""
