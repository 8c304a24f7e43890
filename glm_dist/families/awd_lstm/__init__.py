"""The awd_lstm family -- AWD-LSTM (Merity et al. 2017), ULMFiT's language model.

Its files: spec.py (its registry row), model.py (config, flavors, modules).

How a family is laid out: docs/adding-a-family.md.
"""
