"""The cvt family -- CVT (Clark et al. 2018), cross-view training of a BiLSTM tagger.

Its files: spec.py (its registry row), model.py (config, flavors, modules).

How a family is laid out: docs/adding-a-family.md.
"""
