"""``glm launch``: torchrun with defaults. torchrun's own options follow the command, so ``glm_dist/launch.py``
parses them, not glm's parser."""

from __future__ import annotations

from glm_dist.launch import main

HELP = "torchrun with defaults (see glm launch --help)"

__all__ = ["HELP", "main"]
