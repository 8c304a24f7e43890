"""One package per model family: its model, transformers adapter and registry row.

See docs/architecture.md, decision 10.
"""
