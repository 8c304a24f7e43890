"""``glm finetune`` moved to ``glm_dist/transfer/finetune.py`` (issue 31: train/ does not import transfer/).
This re-export keeps cli.py's import working until the command table imports the new home; it goes then,
with its entry in tests/test_import_graph.py's ALLOWED_UPWARD."""
from glm_dist.transfer.finetune import FinetuneArgs, FinetuneError, finetune

__all__ = ["FinetuneArgs", "FinetuneError", "finetune"]
