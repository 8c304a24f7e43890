"""Stop requests from signals (SLURM ``--signal``, preemption, ``scancel -s``, torchrun's SIGTERM).

The handler only sets a flag; the ranks agree on it in the all-reduce each step already makes (a
signal may reach the ranks at different moments), and then every rank checkpoints and exits
together.
"""

from __future__ import annotations

import signal

SETTLE_S = 60.0  # Ctrl-C: how long the save in flight may take to finish before it is abandoned


class StopRequest:
    def __init__(self, signal_names: list[str]):
        self.received: str | None = None
        for name in signal_names:
            try:
                sig = getattr(signal, name)
            except AttributeError:
                raise ValueError(f"train.stop_signals: unknown signal {name!r}") from None
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
