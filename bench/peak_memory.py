"""Peak resident memory of a block of code, for the CPU benchmarks (torch has no CPU allocator
statistics): the resident set sampled by a thread above what the process held on entry.

``exec_with_mmap_threshold()`` first runs the script again with ``MALLOC_MMAP_THRESHOLD_=65536``,
so glibc maps every allocation over 64 KiB on its own and unmaps it when freed; otherwise freed
heap memory stays resident and is counted.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psutil

MiB = 2**20


def exec_with_mmap_threshold() -> None:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:  # glibc reads it at start: run again with it
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})


class PeakRSS:
    """Highest resident set size above the entry's (``peak``, bytes), sampled every ``interval_s``."""

    def __init__(self, interval_s: float = 2e-4):
        self.interval_s, self.proc, self.peak = interval_s, psutil.Process(), 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss - self.base)
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self.base = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.proc.memory_info().rss - self.base)
