"""The same batches as ``Loader``, built ahead in dataloader worker processes.

Worker ``w`` of ``W`` builds the steps ``s`` with ``s % W == w``: each worker looks its rows up in
the sample index, reads their document pieces and noises/collates only its own steps (the others
it skips without reading), and torch's ``DataLoader`` hands the steps back in order, up to
``prefetch_factor`` steps per worker ahead of training. Each step travels with the loader state after it,
so the state saved in a checkpoint is that of the last step consumed -- resume stays exact and
elastic with any number of workers -- and with its worker's read counts so far (``read_counts``).
"""

from __future__ import annotations

import functools
from collections import Counter

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from glm_dist.data.loader import Loader
from glm_dist.errors import GlmError


class _Steps(IterableDataset):
    def __init__(self, make_loader, state: dict | None):
        self.make_loader, self.state = make_loader, state

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        loader = self.make_loader()
        if self.state is not None:
            loader.load_state_dict(self.state)
        step = 0
        while True:
            mine = step % workers == worker
            batches = loader.next_step(build=mine)
            if mine:
                yield batches, loader.state_dict(), (worker, loader.read_counts())
            step += 1


class WorkerLoader:
    """``Loader``'s interface (``next_step``, ``state_dict``, ``epoch``, ...) over ``num_workers`` processes."""

    def __init__(self, shards_dir: str, *, num_workers: int, prefetch_factor: int = 2, **loader_kwargs):
        self._make = functools.partial(Loader, shards_dir, **loader_kwargs)
        self._local = self._make()  # for the state before the first step and the static properties
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self._state = self._local.state_dict()
        self._it = None
        self._counts: dict[int, dict] = {}  # worker -> its read counts, this iterator
        self._before: Counter = Counter()  # the counts of iterators already closed

    @property
    def global_batch_size(self) -> int:
        return self._local.global_batch_size

    @property
    def epoch(self) -> int:
        return self._state["epoch"]

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        if self._it is None:
            self._it = iter(
                DataLoader(
                    _Steps(self._make, self._state),
                    batch_size=None,
                    num_workers=self.num_workers,
                    prefetch_factor=self.prefetch_factor,
                    persistent_workers=False,
                    pin_memory=torch.cuda.is_available(),
                )
            )  # then copies to the GPU are async
        try:
            batches, self._state, (worker, counts) = next(self._it)
        except GlmError as err:  # a worker's: torch re-raises it with the worker's traceback as its message
            raise type(err)(str(err).rstrip().splitlines()[-1].split(": ", 1)[-1]) from None
        self._counts[worker] = counts
        return batches

    def read_counts(self) -> dict[str, int]:
        """``Loader.read_counts`` summed over the workers (and over earlier iterators)."""
        total = self._before + sum((Counter(c) for c in self._counts.values()), Counter())
        return {k: int(total[k]) for k in self._local.read_counts()}

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self._local.load_state_dict(state)  # validates (seed, shards, objective)
        self._before += sum((Counter(c) for c in self._counts.values()), Counter())
        self._state, self._it, self._counts = state, None, {}
