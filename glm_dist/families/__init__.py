"""One package per model family: its registry row (spec.py), model (model.py) and transformers
adapter (hf.py); ``spec.py`` here holds the row's types, ``registry.py`` gathers the rows.

See docs/architecture.md, decision 10, and docs/adding-a-family.md.
"""
