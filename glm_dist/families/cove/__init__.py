"""The cove family: its model (model.py) and, where it exports, its transformers adapter (hf.py)."""
