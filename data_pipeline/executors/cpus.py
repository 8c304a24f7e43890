"""How many CPUs this process may use: the size of a process pool, the threads of a worker."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask where the OS keeps one (Linux: SLURM's task
    binding, taskset, a container's cpuset), else every CPU of the machine. ``os.cpu_count()`` counts the
    machine, so a job given 8 of 128 cores would start 128 workers on those 8."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
