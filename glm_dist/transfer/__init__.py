"""Downstream use of pretrained models (docs/architecture.md#map-of-the-code), one module per job beside the heads.

``glm finetune`` (``finetune``) trains every task kind through the one fine-tuning loop (``loop``). GPT's
recipe (``gpt``): task input transformations (``inputs``), the last-token classifier with the LM loss as
auxiliary objective (``heads``) and named option recipes (``recipes``). Other families' downstream modules
sit beside them."""
