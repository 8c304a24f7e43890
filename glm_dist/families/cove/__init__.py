"""The cove family -- CoVe (McCann et al. 2017), the translation encoder over GloVe.

Its files: spec.py (its registry row), model.py (config, flavors, modules).

How a family is laid out: docs/adding-a-family.md.
"""
