"""The glove family -- GloVe (Pennington et al. 2014), word vectors from co-occurrence counts.

Its files: spec.py (its registry row), model.py (config, flavors, modules).

How a family is laid out: docs/adding-a-family.md.
"""
