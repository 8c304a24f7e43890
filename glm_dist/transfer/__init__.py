"""Downstream use of pretrained models (docs/architecture.md#map-of-the-code), one module per job beside the heads.

GPT's fine-tuning recipe: task input transformations (``inputs``), the last-token classifier with
the LM loss as auxiliary objective (``heads``), its training loop (``finetune``) and named option
recipes (``recipes``). Other families' downstream modules sit beside them."""
