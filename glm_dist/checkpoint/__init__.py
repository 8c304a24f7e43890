"""Reading checkpoints: verification, weights-only loads, consolidation to the unsplit model.

Below both ``train/`` (which writes checkpoints) and ``eval/`` / ``hf/`` (which read them)."""
