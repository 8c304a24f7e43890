"""The training loader: each rank builds only its own samples of the global batch (docs/architecture.md,
decisions 5 and 12).

The global order is a *sample index* (data/plan.py), computed from the shards' index files
(data/index.py) without reading a shard: global sample g is unit u of epoch e, and unit u packs
these pieces of these documents. Step s holds samples [s·B, (s + 1)·B) of the global batch B =
``micro_batch_size * grad_accum_steps * dp_size``; rank r keeps its micro-batch slices and reads,
by byte range, only the document pieces they pack (data/reader.py). The global batch does not depend
on the data-parallel size, every rank gets the same number of batches, and the saved position (the
sample counter) means the same at any world size: exact resume, and elastic resume at another
data-parallel size (also with another global batch, each sample of the epoch seen once). With
``streams`` (XLNet's memory) row b of every step is the next unit of stream b.

A *mixture* (data/mixture.py) in place of one shard set: its blended index sends global sample g to
source s's k-th sample, and each source is a loader of its own (its sample index, its reshuffle,
its reader); each batch carries ``source``, the source of each row. Streams from a mixture: stream
b's next unit is the next unit of stream b of the source the blend gives it (data/mixture.py), and
its memory id is s x B + b, so a memory always continues its own source's text.

Noise (masks, spans, permutations) is drawn from ``default_rng([seed, salt, 1, epoch, sample])``:
new masks every epoch, the same masks after a resume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.tokenizer_file import parse_tokenizer
from data_pipeline.tokenize.vocab_tables import word_start_table
from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES
from glm_dist.config.schema import ObjectiveConfig
from glm_dist.data.documents import DocumentOrder
from glm_dist.data.index import DocTable, cache_root, load_doc_table
from glm_dist.data.mixture import Mixture
from glm_dist.data.plan import ADDRESS, BuiltPlan, Located, PackedPlan, SampleIndex, StreamIndex, rebuild, unit_arrays
from glm_dist.data.plan_cache import PlanCache
from glm_dist.data.reader import RangeReader, ReadStats, empty_store, intervals
from glm_dist.data.shards import ShardSetError, open_shard_file, read_manifest, shard_urls
from glm_dist.errors import GlmError
from glm_dist.objectives.base import Vocab
from glm_dist.objectives.clm import TokenPacker
from glm_dist.objectives.registry import collate, get_objective

DEFAULT_OBJECTIVE = ObjectiveConfig().name  # the config's default
STATE_FORMAT = "glm-dist/sample-index/v1"
MAX_STEP_TOKENS = 2**32  # one rank's tokens per optimizer step, all built at once: 32 GiB of int64 ids, far above
# any real run (config/checks.py bounds a micro batch at 2**28 tokens; this guards every other way a loader is made)
log = logging.getLogger(__name__)


def read_tokenizer(shards_dir: str, manifest: dict) -> Tokenizer:
    """The shard set's tokenizer (a local path or any allowed URL)."""
    path = f"{shards_dir}/{manifest['tokenizer']['file']}"
    with open_shard_file(path) as f:
        return parse_tokenizer(
            f.read(MAX_TOKENIZER_BYTES), where=path, fix="rebuild the shard set with glm data tokenize"
        )


def vocab_from_manifest(shards_dir: str, manifest: dict, *, whole_word: bool = False) -> Vocab:
    t = manifest["tokenizer"]
    ids = t.get("special_ids") or {"eot": t["eot_id"], "all_specials": [t["eot_id"]]}
    word_starts = word_start_table(read_tokenizer(shards_dir, manifest)) if whole_word else None
    return Vocab(size=t["vocab_size"], ids=ids, word_starts=word_starts)


def check_batch_shape(
    *, seq_len: int, micro_batch_size: int, grad_accum_steps: int, dp_rank: int, dp_size: int
) -> None:
    """Refuse a batch no rank can build before anything is allocated for it."""
    sizes = {
        "data.seq_len": seq_len,
        "train.micro_batch_size": micro_batch_size,
        "train.grad_accum_steps": grad_accum_steps,
        "the data-parallel size": dp_size,
    }
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise GlmError(f"{key}={value!r} must be a whole number, 1 or more")
    if not 0 <= dp_rank < dp_size:
        raise GlmError(f"data-parallel rank {dp_rank} is not one of the {dp_size} ranks")
    tokens = int(seq_len) * int(micro_batch_size) * int(grad_accum_steps)
    if tokens > MAX_STEP_TOKENS:
        raise GlmError(
            f"train.micro_batch_size={micro_batch_size} x train.grad_accum_steps={grad_accum_steps} x "
            f"data.seq_len={seq_len} is {tokens} tokens per rank and step, more than a rank can build "
            f"(at most {MAX_STEP_TOKENS}): lower the batch sizes"
        )


class PositionMismatch(GlmError, ValueError):
    """A saved data position that means another order in this run (one line, exit 2)."""


class Loader:
    def __init__(
        self,
        shards_dir: str | Mixture,
        *,
        objective: str = DEFAULT_OBJECTIVE,
        split: str = "train",
        seq_len: int,
        micro_batch_size: int,
        grad_accum_steps: int = 1,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_window: int = 1,
        options=None,
        streams: bool = False,
        cache_dir: str = "",
        read_gap_bytes: int = 0,
        read_retries: int = 3,
        read_backoff_s: float = 0.5,
        reads: bool = True,
    ):
        """``reads=False``: a rank that needs no batch (a middle pipeline stage) reads nothing; its
        batches have the right shapes, filled with the pad token. ``shards_dir`` a ``Mixture``: one
        loader per source (seeded by the source's name), drawn from by the blended index."""
        check_batch_shape(
            seq_len=seq_len,
            micro_batch_size=micro_batch_size,
            grad_accum_steps=grad_accum_steps,
            dp_rank=dp_rank,
            dp_size=dp_size,
        )
        self.mixture = shards_dir if isinstance(shards_dir, Mixture) else None
        self.parts: list[Loader] = []  # a mixture's sources, in its order
        if self.mixture is not None:
            same = dict(
                objective=objective,
                split=split,
                seq_len=seq_len,
                micro_batch_size=micro_batch_size,
                grad_accum_steps=grad_accum_steps,
                dp_rank=dp_rank,
                dp_size=dp_size,
                shuffle=shuffle,
                shuffle_window=shuffle_window,
                options=options,
                streams=streams,
                cache_dir=cache_dir,
                read_gap_bytes=read_gap_bytes,
                read_retries=read_retries,
                read_backoff_s=read_backoff_s,
                reads=reads,
            )
            self.parts = [
                Loader(root, seed=self.mixture.seed(seed, s), **same) for s, root in enumerate(self.mixture.shards_dirs)
            ]
            shards_dir = self.mixture.shards_dirs[0]  # the shared tokenizer's
        self.root, self.split, self.manifest = shards_dir, split, read_manifest(shards_dir)
        self.num_shards = (
            sum(p.num_shards for p in self.parts)
            if self.mixture is not None
            else len(shard_urls(shards_dir, self.manifest, split))
        )
        self.objective, self.seed, self.seq_len = get_objective(objective), seed, seq_len
        self.micro, self.accum = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.shuffle, self.window, self.streams, self.reads = shuffle, shuffle_window, streams, reads
        self.options = options if options is not None else self.objective.options()  # objectives/base.py
        self.vocab = vocab_from_manifest(
            shards_dir, self.manifest, whole_word=self.objective.needs_word_starts(self.options)
        )
        self.pad_id = self.vocab.ids.get("pad") if self.vocab.ids.get("pad") is not None else self.vocab.ids["eot"]
        self.width = seq_len if self.objective.padded else None
        self._plain_id = min(set(range(len(self.vocab.specials) + 1)) - set(self.vocab.specials.tolist()))
        self.read_options = dict(
            gap_bytes=read_gap_bytes, retries=read_retries, backoff_s=read_backoff_s, cache_dir=cache_dir
        )
        self.steps = 0
        self.samples = 0  # the global sample number of the next step's first sample
        self.last_samples: list[tuple] = []  # (sample, epoch, unit[, source of a mixture]) of this rank's last rows
        self._skipped_shards: Counter = Counter()
        self._index: SampleIndex | StreamIndex | None = None
        self._reader: RangeReader | None = None

    @property
    def global_batch_size(self) -> int:
        return self.micro * self.accum * self.dp_size

    @property
    def num_streams(self) -> int:
        return self.global_batch_size if self.streams else 1

    def _rng(self, epoch: int, sample: int, stage: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.objective.salt, stage, epoch, sample])

    def _builders(self) -> list:
        return [
            self.objective.builder(seq_len=self.seq_len, vocab=self.vocab, opts=self.options, stream=i)
            for i in range(self.num_streams)
        ]

    def _setup(self) -> SampleIndex | StreamIndex:
        """The sample index and the reader, made at the first use (no shard is read); a mixture's
        are its sources' (each set up here)."""
        if self._index is not None or self.mixture is not None:
            for part in self.parts:
                part._setup()
            return self._index
        table = load_doc_table(self.root, self.manifest, self.split, cache_dir=self.read_options["cache_dir"])
        for shard in table.problems:
            self._skipped_shards[f"unreadable_shard:{table.url(shard)}"] += 1
        order = DocumentOrder(table, seed=self.seed, shuffle=self.shuffle, window=self.window)
        if order.num_docs == 0:
            reasons = list(table.problems.values())
            shown = "; ".join(reasons[:3]) + (f"; ... {len(reasons) - 3} more" if len(reasons) > 3 else "")
            raise ShardSetError(
                f"no readable document in any of the {table.num_shards} shards ({len(reasons)} "
                f"skipped: {shown}); rebuild them with glm data tokenize or point data.shards_dir "
                f"at a good set"
            )
        self.objective.check_documents(table.dtype)
        first = self._builders()[0]
        if type(first) is TokenPacker and not self.streams:  # closed form: any corpus size at once
            plan = PackedPlan(order, block=first.block_len, stride=first.stride, sep=first.sep)
        else:
            plan = BuiltPlan(
                order,
                self._builders,
                lambda e: lambda k: self._rng(e, k, 0),
                seed=self.seed,
                shuffle=self.shuffle,
                cache=self._plan_cache(table, first),
            )
        self._plan = plan
        self._index = StreamIndex(plan) if self.streams else SampleIndex(plan, seed=self.seed, shuffle=self.shuffle)
        self._reader = RangeReader(table, **self.read_options)
        return self._index

    def _plan_cache(self, table: DocTable, builder) -> PlanCache | None:
        """Where this run's epoch plans are kept, keyed by everything its units depend on -- the
        builder's source included, so a changed rule never reads an old plan."""
        where = cache_root(self.root, self.read_options["cache_dir"])
        if where is None:
            return None
        sources = sorted({inspect.getsourcefile(type(builder)), inspect.getsourcefile(BuiltPlan)})
        key = {
            "table": table.digest,
            "problems": sorted(table.problems),
            "objective": self.objective.name,
            "salt": self.objective.salt,
            "seq_len": self.seq_len,
            "options": dataclasses.asdict(self.options),
            "vocab": self.vocab.ids,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "window": self.window,
            "streams": self.num_streams,
            "rule": [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in sources],
        }
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return PlanCache(f"{where}/plans/{self.split}-{digest}")

    @property
    def order(self) -> DocumentOrder:
        """The documents' order in each epoch (what the units are packed from)."""
        self._setup()
        return self._plan.order

    @property
    def epoch(self) -> int:
        """The epoch of the next sample (a mixture: the furthest epoch any source's next sample is in)."""
        if self.mixture is not None:
            return max(self._source_epochs())
        index = self._setup()
        return index.epoch_of(0, self.steps) if self.streams else index.epoch_of(self.samples)

    def _source_epochs(self) -> list[int]:
        """A mixture's sources: the epoch each one's next sample is in (streams: stream 0's next unit)."""
        counts = self.mixture.blend.counts(self.steps if self.streams else self.samples)
        return [
            p._setup().epoch_of(0, k) if self.streams else p._setup().epoch_of(k) for p, k in zip(self.parts, counts)
        ]

    def next_step_epoch(self) -> int:
        """The epoch of the next step's last sample (a mixture: the furthest any source's is in; nothing is read)."""
        if self.mixture is not None and self.streams:
            sources, units = self.mixture.blend.stream_assign(self.steps, self.num_streams)
            return max(self.parts[s]._setup().epoch_of(b, int(k)) for b, (s, k) in enumerate(zip(sources, units)))
        if self.mixture is not None:
            counts = self.mixture.blend.counts(self.samples + self.global_batch_size)
            return max(p._setup().epoch_of(k - 1) for p, k in zip(self.parts, counts) if k)
        index = self._setup()
        if self.streams:
            return max(index.epoch_of(b, self.steps) for b in range(self.num_streams))
        return index.epoch_of(self.samples + self.global_batch_size - 1)

    @property
    def skipped(self) -> Counter:
        """Shards skipped on every rank alike (their index or size is wrong) and documents this rank
        could not read, by name."""
        self._setup()
        if self.mixture is not None:
            return sum((p.skipped for p in self.parts), Counter())
        return self._skipped_shards + self._reader.skipped

    @property
    def read_stats(self) -> ReadStats:
        self._setup()
        if self.mixture is not None:
            stats = [p.read_stats for p in self.parts]
            return ReadStats(sum(x.bytes for x in stats), sum(x.requests for x in stats))
        return self._reader.stats

    @property
    def read_errors(self) -> list[str]:
        """Why reads failed after their retries, in order (a mixture: source by source)."""
        self._setup()
        return [e for p in self.parts for e in p.read_errors] if self.mixture is not None else self._reader.errors

    @property
    def sources(self) -> list[str]:
        """The mixture's source names, which the batch's ``source`` ids index (one shard set: none)."""
        return list(self.mixture.names) if self.mixture is not None else []

    def drawn(self) -> dict[str, dict[str, float]]:
        """Per mixture source (one shard set: none), from the position alone: the tokens the steps so
        far drew, the epochs that makes (tokens drawn / tokens available, GPT-3's count) and ``epoch``,
        the epoch of its sample index its next sample is in."""
        if self.mixture is None:
            return {}
        drawn = self.mixture.drawn(self.samples, self.seq_len, streams=self.num_streams)
        for name, epoch in zip(self.mixture.names, self._source_epochs()):
            drawn[name]["epoch"] = epoch
        return drawn

    def read_counts(self) -> dict[str, int]:
        """What this rank has read so far and could not read: bytes and requests of its range reads,
        documents skipped after retries (this rank's), shards skipped (every rank alike)."""
        skipped = self.skipped
        return {
            "bytes_read": self.read_stats.bytes,
            "read_requests": self.read_stats.requests,
            "skipped_documents": sum(n for k, n in skipped.items() if k.startswith("unreadable_document:")),
            "skipped_shards": sum(n for k, n in skipped.items() if k.startswith("unreadable_shard:")),
        }

    def my_rows(self) -> list[list[int]]:
        """This rank's rows of the global batch, one list per micro batch."""
        out = []
        for m in range(self.accum):
            start = (m * self.dp_size + self.dp_rank) * self.micro
            rows = list(range(start, start + self.micro))
            if self.streams and self.objective.backward_streams(self.options):  # forward streams (even) first
                rows.sort(key=lambda row: row % 2)
            out.append(rows)
        return out

    def locate(self, row: int) -> Located:
        """Row ``row`` of the next step: its epoch, its unit and the pieces it packs."""
        if self.mixture is not None:
            return self._locate_step([row])[row][2]
        index = self._setup()
        return index.locate(row, self.steps) if self.streams else index.locate(self.samples + row)

    def _locate_step(self, rows: list[int]) -> dict[int, tuple[int, int, Located]]:
        """row -> (source, the sample's number in that source, where it is) for rows of the next step.
        Streams: row b is stream b's unit k of its source's stream b, numbered k x B + b (its noise's key)."""
        if self.mixture is None:
            return {row: (0, self.samples + row, self.locate(row)) for row in rows}
        if self.streams:
            sources, units = self.mixture.blend.stream_assign(self.steps, self.num_streams)
            return {
                row: (
                    int(sources[row]),
                    int(units[row]) * self.num_streams + row,
                    self.parts[sources[row]]._setup().locate(row, int(units[row])),
                )
                for row in rows
            }
        sources, numbers = self.mixture.blend.assign(self.samples, self.global_batch_size)  # the whole step: cheap
        return {
            row: (int(sources[row]), int(numbers[row]), self.parts[sources[row]]._setup().locate(int(numbers[row])))
            for row in rows
        }

    def next_step(self, *, build: bool = True) -> list[dict[str, torch.Tensor]]:
        """This rank's ``grad_accum_steps`` micro batches for the next optimizer step
        (``build=False``: advance past the step without reading, noising or collating -- for workers)."""
        rows = self.my_rows()
        located = self._locate_step([row for micro in rows for row in micro])
        self.last_samples = [
            (self.samples + row, loc.epoch, loc.unit_id, *([s] if self.mixture else []))
            for row, (s, _, loc) in located.items()
        ]
        out = self._build(rows, located) if build else []
        self.samples += self.global_batch_size
        self.steps += 1
        return out

    def _build(
        self, rows: list[list[int]], located: dict[int, tuple[int, int, Located]]
    ) -> list[dict[str, torch.Tensor]]:
        samples = {}
        for s, part in enumerate(self.parts or [self]):
            units = {row: (k, loc) for row, (src, k, loc) in located.items() if src == s}
            if units:
                samples.update(part._samples(units))
        out = []
        for micro in rows:
            batch = collate([samples[row] for row in micro], pad_id=self.pad_id, width=self.width)
            if self.streams:  # the memories' ids: global stream ids (a mixture: per source, s x B + b)
                batch["rows"] = torch.tensor([located[row][0] * self.num_streams + row for row in micro])
            if self.mixture is not None:
                batch["source"] = torch.tensor([located[row][0] for row in micro], dtype=torch.long)  # (B,)
            out.append(batch)
        return out

    def _samples(self, units: dict[int, tuple[int, Located]]) -> dict:
        """row -> its sample: the pieces of these units of this shard set read in one pass, then noised
        by (epoch, the sample's number)."""
        arrays = {row: unit_arrays(loc.unit) for row, (_, loc) in units.items()}
        values = np.concatenate([np.zeros(0, dtype=np.int64)] + [a for arr in arrays.values() for a in arr])
        addresses = values[values >= ADDRESS] - ADDRESS
        store = self._reader.read(*intervals(addresses)) if self.reads else empty_store(self._reader.table.dtype)
        filler = self.pad_id if self.reads else self._plain_id  # unread: a plain token, so noise keeps its shapes
        out = {}
        for row, (number, loc) in units.items():
            unit = rebuild(loc.unit, (store.resolve(v, filler) for v in arrays[row]), self._plan.consts)
            rng = self._rng(loc.epoch, number, 1)
            out[row] = self.objective.sample(unit, rng, vocab=self.vocab, opts=self.options)
        return out

    def state_dict(self) -> dict:
        state = {
            "format": STATE_FORMAT,
            "samples": self.samples,
            "steps": self.steps,
            "epoch": self.epoch,
            "objective": self.objective.name,
            "global_batch_size": self.global_batch_size,
            "streams": self.num_streams,
            "seed": self.seed,
            "num_shards": self.num_shards,
            "window": self.window,
        }
        return {**state, "mixture": self.mixture.state()} if self.mixture is not None else state

    def load_state_dict(self, state: dict) -> None:
        """Take a saved data position; one that means another order in this run is a ``PositionMismatch``."""
        self._check_position(state)
        self.steps, self.samples = state["steps"], state["samples"]

    def _check_position(self, state: dict) -> None:
        """The saved order is this run's: same format, objective, streams, seed, shards, window and mixture."""
        if state.get("format") != STATE_FORMAT:
            raise PositionMismatch(
                f"the data position was saved by the loader before sample indices (format "
                f"{state.get('format', 'v0')!r}); it cannot be resumed exactly: start the run "
                f"afresh or resume it with the glm-dist version that saved it"
            )
        if state["objective"] != self.objective.name:
            raise PositionMismatch(
                f"data position was saved for objective {state['objective']!r}, this run uses "
                f"{self.objective.name!r}: resume with the same objective.name"
            )
        if state["streams"] != self.num_streams:
            raise PositionMismatch(
                f"data position was saved for {state['streams']} streams, this run has "
                f"{self.num_streams} (the global batch size of a streamed objective): resume "
                f"with the same global batch"
            )
        saved = (state["seed"], state["num_shards"], state["window"])
        if saved != (self.seed, self.num_shards, self.window):
            raise PositionMismatch(
                f"data position was saved for seed {saved[0]} over {saved[1]} shards with a "
                f"shuffle window of {saved[2]}; this run has seed {self.seed} over "
                f"{self.num_shards} shards with a window of {self.window} -- resume with the same "
                f"data, seed and window"
            )
        mixture = self.mixture.state() if self.mixture is not None else None
        if state.get("mixture") != mixture:
            raise PositionMismatch(
                f"data position was saved for {_order_of(state.get('mixture'))}, this run has "
                f"{_order_of(mixture)}: the blended order would differ; resume with the same "
                f"sources and weights (an epochs source's weight follows train.max_steps and the "
                f"global batch)"
            )


def _order_of(mixture: dict | None) -> str:
    """A saved mixture state in words (its weights x 2^32)."""
    if mixture is None:
        return "one shard set (no data.mixture)"
    return "the mixture " + ", ".join(f"{n}={w}" for n, w in zip(mixture["names"], mixture["weights"]))


def validation_batches(
    shards_dir: str | Mixture,
    *,
    seq_len: int,
    micro_batch_size: int,
    num_batches: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    objective: str = DEFAULT_OBJECTIVE,
    options=None,
) -> list[tuple[dict[str, torch.Tensor], float]]:
    """The fixed validation set (the first ``num_batches`` batches of the held-out split, in stored
    order, fixed noise), split round-robin over ranks; each rank reads only its own batches. Each
    rank gets the same number of (batch, weight) pairs; padding entries have weight 0 so every rank
    runs the same number of forward passes. A mixture: each source's own set in turn (up to
    ``num_batches`` each, so a small held-out split limits only its own), every row with its ``source``."""
    kw = dict(
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        num_batches=num_batches,
        dp_rank=dp_rank,
        dp_size=dp_size,
        objective=objective,
        options=options,
    )
    if isinstance(shards_dir, Mixture):
        out = []
        for s, root in enumerate(shards_dir.shards_dirs):
            for batch, weight in validation_batches(root, **kw):
                batch["source"] = torch.full((len(next(iter(batch.values()))),), s, dtype=torch.long)  # (B,)
                out.append((batch, weight))
        return out
    kw = dict(
        objective=objective,
        split="validation",
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        shuffle=False,
        options=options,
    )
    loader, mine, count = Loader(shards_dir, **kw), [], 0
    for i in range(num_batches):
        if loader.next_step_epoch() > 0 and count:
            break  # the held-out split is smaller than asked: do not repeat it
        batches = loader.next_step(build=i % dp_size == dp_rank)
        mine += batches[:1]
        count += 1
    check_validation_read(loader)
    per_rank = -(-count // dp_size)
    pad = mine[0] if mine else Loader(shards_dir, **kw).next_step()[0]
    return [(b, 1.0) for b in mine] + [(pad, 0.0)] * (per_rank - len(mine))


def check_validation_read(loader: Loader) -> None:
    """A validation set holds what the held-out split holds, never padding: a document that could
    not be read stops the run here (at its start) with the reason; shards skipped on every rank
    alike (their index or size is wrong) leave the set smaller, said once."""
    counts = loader.read_counts()
    if counts["skipped_documents"]:
        raise GlmError(
            f"validation: {counts['skipped_documents']} held-out document(s) of {loader.root} could not "
            f"be read after data.read_retries ({loader.read_errors[0]}); their loss would score padding: "
            f"make the shards readable and start again"
        )
    if counts["skipped_shards"]:
        log.warning(
            "validation: %d shard(s) of the held-out split skipped, the validation set is that much smaller: %s",
            counts["skipped_shards"],
            "; ".join(sorted(loader.skipped)),
        )
