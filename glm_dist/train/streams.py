"""Segment-level recurrence across steps (Transformer-XL, XLNet): each global stream's memory.

With ``mem_len`` > 0 the loader deals the global batch as parallel streams (row b of step s + 1
continues row b of step s) and tags each row with its stream id. The trainer keeps, per stream,
the model's memory of its last segment (one (M, d) tensor per layer, cut from the graph), hands
it back with the stream's next segment, and saves it with every checkpoint: each rank writes the
streams it holds (``stream_memory/rank<r>.safetensors``), and a resume at any data-parallel size
loads the streams its ranks now hold -- so a resume is exact at any layout.
"""

from __future__ import annotations

import torch

from glm_common.storage import Storage
from glm_dist.checkpoint import tensorfile
from glm_dist.checkpoint.files import CheckpointError
from glm_dist.checkpoint.writer import RankFiles

DIR = "stream_memory"


class StreamMemory:
    def __init__(self) -> None:
        self.rows: dict[int, list[torch.Tensor]] = {}  # the streams this rank holds: id -> per layer (M, d)
        self.saved: dict[int, list[torch.Tensor]] = {}  # every stream of the checkpoint resumed from

    def take(self, rows: torch.Tensor, device) -> list[torch.Tensor] | None:
        """The memory of these streams, per layer (B, M, d); None before their first segment."""
        ids = rows.tolist()
        for r in ids:
            if r not in self.rows and r in self.saved:
                self.rows[r] = self.saved.pop(r)
        if not all(r in self.rows for r in ids):
            return None
        layers = zip(*(self.rows[r] for r in ids))
        return [torch.stack(per_row).to(device, non_blocking=True) for per_row in layers]

    def put(self, rows: torch.Tensor, mems: list[torch.Tensor]) -> None:
        """Keep each stream's new memory (``mems``: per layer (B, M, d))."""
        for i, r in enumerate(rows.tolist()):
            self.rows[r] = [m[i].detach() for m in mems]

    def capture(self, files: RankFiles) -> None:
        """Copy the streams this rank holds to host memory, for the checkpoint being written."""
        if not self.rows:
            return
        ids = sorted(self.rows)
        tensors = [("rows", torch.tensor(ids))]
        for layer in range(len(self.rows[ids[0]])):
            tensors.append((f"layer{layer}", torch.stack([self.rows[r][layer] for r in ids]).cpu()))
        files.tensors[f"{DIR}/rank{files.rank:05d}.safetensors"] = tensors

    def load(self, ckpt: Storage, meta: dict) -> None:
        """Every saved stream (whichever rank saved it); this rank takes those it is dealt."""
        for rel in sorted(r for r in meta["files"] if r.startswith(f"{DIR}/")):
            tensors = tensorfile.read_all(ckpt, rel)
            try:
                layers = [tensors[f"layer{i}"] for i in range(len(tensors) - 1)]
                for i, r in enumerate(tensors["rows"].tolist()):
                    self.saved[r] = [layer[i] for layer in layers]
            except (KeyError, IndexError) as err:
                raise CheckpointError(
                    f"checkpoint file {ckpt}/{rel} is corrupt ({type(err).__name__}: {err}); use an earlier checkpoint"
                ) from None
