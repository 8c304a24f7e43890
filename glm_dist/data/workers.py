"""The same batches as ``Loader``, built ahead in dataloader worker processes.

Worker ``w`` of ``W`` builds the steps ``s`` with ``s % W == w``: each worker runs the cheap
packing over the whole global order and noises/collates only its own steps, and torch's
``DataLoader`` hands the steps back in order. Each step travels with the loader state after it,
so the state saved in a checkpoint is that of the last step consumed -- resume stays exact and
elastic with any number of workers.
"""
from __future__ import annotations

import functools

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from glm_dist.data.loader import Loader


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
                yield batches, loader.state_dict()
            step += 1


class WorkerLoader:
    """``Loader``'s interface (``next_step``, ``state_dict``, ``epoch``, ...) over ``num_workers`` processes."""

    def __init__(self, shards_dir: str, *, num_workers: int, prefetch_factor: int = 2, **loader_kwargs):
        self._make = functools.partial(Loader, shards_dir, **loader_kwargs)
        self._local = self._make()  # for the state before the first step and the static properties
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self._state = self._local.state_dict()
        self._it = None

    @property
    def global_batch_size(self) -> int:
        return self._local.global_batch_size

    @property
    def epoch(self) -> int:
        return self._state["stream"]["epoch"]

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        if self._it is None:
            self._it = iter(DataLoader(_Steps(self._make, self._state), batch_size=None, num_workers=self.num_workers,
                                       prefetch_factor=self.prefetch_factor, persistent_workers=False))
        batches, self._state = next(self._it)
        return batches

    def state_dict(self) -> dict:
        return self._state

    def load_state_dict(self, state: dict) -> None:
        self._local.load_state_dict(state)  # validates (seed, shards, objective)
        self._state, self._it = state, None
