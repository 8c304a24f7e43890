"""The elmo family -- ELMo (Peters et al. 2018), the character-CNN biLM.

Its files: spec.py (its registry row), model.py (config, flavors, modules).

How a family is laid out: docs/adding-a-family.md.
"""
