"""Errors that end a training run with a message instead of a traceback."""


class TrainingDiverged(RuntimeError):
    """Too many steps with a non-finite loss."""
