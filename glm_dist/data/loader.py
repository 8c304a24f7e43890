"""The training loader: a global stream of samples, sliced by data-parallel rank.

Every rank builds the same global batch of ``micro_batch_size * grad_accum_steps * dp_size`` units
per optimizer step (packing is cheap) and noises only its own slices. So all ranks see the same
number of batches, the global batch does not depend on the world size (1 and N processes train on
the same data), and the saved state -- document position, the objective's builder state, the
sample counter -- means the same at any world size: exact resume, and elastic resume at another
data-parallel size.

Noise (masks, spans, permutations) is drawn from ``default_rng([seed, objective, epoch, sample])``:
new masks every epoch, the same masks after a resume.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.vocab_tables import word_start_table
from glm_dist.data.documents import DocumentStream
from glm_dist.data.shards import read_manifest, shard_sizes, shard_urls
from glm_dist.objectives.registry import (SALT, VARIABLE_LENGTH, ObjectiveOptions, UnitSource, Vocab, collate,
                                          make_sample)


def vocab_from_manifest(shards_dir: str, manifest: dict, *, whole_word: bool = False) -> Vocab:
    t = manifest["tokenizer"]
    ids = t.get("special_ids") or {"eot": t["eot_id"], "all_specials": [t["eot_id"]]}
    word_starts = None
    if whole_word:
        import fsspec

        with fsspec.open(f"{shards_dir}/{t['file']}", "r") as f:
            word_starts = word_start_table(Tokenizer.from_str(f.read()))
    return Vocab(size=t["vocab_size"], ids=ids, word_starts=word_starts)


class Loader:
    def __init__(self, shards_dir: str, *, objective: str = "clm", split: str = "train", seq_len: int,
                 micro_batch_size: int, grad_accum_steps: int = 1, dp_rank: int = 0, dp_size: int = 1, seed: int = 0,
                 shuffle: bool = True, shuffle_window: int = 1, options: ObjectiveOptions | None = None):
        manifest = read_manifest(shards_dir)
        self.objective, self.seed = objective, seed
        self.micro, self.accum = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.options = options or ObjectiveOptions()
        self.vocab = vocab_from_manifest(shards_dir, manifest, whole_word=self.options.masking.whole_word)
        self.pad_id = self.vocab.ids.get("pad") if self.vocab.ids.get("pad") is not None else self.vocab.ids["eot"]
        self.stream = DocumentStream(shard_urls(shards_dir, manifest, split), seed=seed, shuffle=shuffle,
                                     window=shuffle_window, sizes=shard_sizes(manifest, split))
        self.source = UnitSource(objective, seq_len=seq_len, vocab=self.vocab, opts=self.options)
        self.width = seq_len if objective in VARIABLE_LENGTH else None
        self.steps = 0
        self.samples = 0  # units emitted so far: the sample number of the next one
        self._units: Iterator | None = None

    @property
    def global_batch_size(self) -> int:
        return self.micro * self.accum * self.dp_size

    def _rng(self, epoch: int, sample: int, stage: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, SALT[self.objective], stage, epoch, sample])

    @property
    def epoch(self) -> int:
        return self.stream.position.epoch

    def next_step(self, *, build: bool = True) -> list[dict[str, torch.Tensor]]:
        """This rank's ``grad_accum_steps`` micro batches for the next optimizer step
        (``build=False``: advance past the step without noising or collating -- for workers)."""
        if self._units is None:
            self._units = self.source.units(self.stream, lambda k: self._rng(self.stream.position.epoch, k, 0))
        units = []
        for _ in range(self.global_batch_size):
            unit = next(self._units)
            units.append((unit, self.stream.position.epoch, self.samples))
            self.samples += 1
        self.steps += 1
        out = []
        for m in range(self.accum if build else 0):
            start = (m * self.dp_size + self.dp_rank) * self.micro
            samples = [make_sample(self.objective, unit, self._rng(epoch, k, 1), vocab=self.vocab, opts=self.options)
                       for unit, epoch, k in units[start:start + self.micro]]
            out.append(collate(samples, pad_id=self.pad_id, width=self.width))
        return out

    def state_dict(self) -> dict:
        return {"stream": self.stream.state_dict(), "builder": self.source.state_dict(), "steps": self.steps,
                "samples": self.samples, "objective": self.objective, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict) -> None:
        if state["objective"] != self.objective:
            raise ValueError(f"data position was saved for objective {state['objective']!r}, this run uses "
                             f"{self.objective!r}")
        self.stream.load_state_dict(state["stream"])
        self.source.load_state_dict(state["builder"])
        self.steps, self.samples = state["steps"], state["samples"]
        self._units = None


def validation_batches(shards_dir: str, *, seq_len: int, micro_batch_size: int, num_batches: int, dp_rank: int = 0,
                       dp_size: int = 1, objective: str = "clm") -> list[tuple[dict[str, torch.Tensor], float]]:
    """The fixed validation set (the first ``num_batches`` batches of the held-out split, in stored
    order, fixed noise), split round-robin over ranks. Each rank gets the same number of (batch,
    weight) pairs; padding entries have weight 0 so every rank runs the same number of forward passes."""
    loader = Loader(shards_dir, objective=objective, split="validation", seq_len=seq_len,
                    micro_batch_size=micro_batch_size, shuffle=False)
    first_epoch = []
    for _ in range(num_batches):
        batch = loader.next_step()[0]
        if loader.stream.position.epoch > 0 and first_epoch:
            break  # the held-out split is smaller than asked: do not repeat it
        first_epoch.append(batch)
    mine = first_epoch[dp_rank::dp_size]
    per_rank = -(-len(first_epoch) // dp_size)
    return [(b, 1.0) for b in mine] + [(first_epoch[0], 0.0)] * (per_rank - len(mine))
