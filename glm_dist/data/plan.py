"""The global sample index (docs/architecture.md, decision 12): which document pieces sample g packs,
computed from the document table alone -- no shard is read to plan.

Each objective keeps its one unit rule, its builder (objectives/*.py). To plan, the builder runs
over *address documents*: documents whose "tokens" are the addresses ``ADDRESS | doc << 32 |
token`` of their tokens (``address_doc``). It slices, concatenates and inserts special tokens as it
does with real tokens, so each unit it emits says exactly which token of which document goes where;
reading fills the addresses in (data/reader.py). Units are stored as runs ``(value, length, step)``
(a few per unit). ``TokenPacker`` (CLM, T5, XLNet blocks) is also planned in closed form
(``PackedPlan``): unit k is positions [k·stride, k·stride + block) of the epochs' document stream,
found by two binary searches, so a corpus of 10^8 documents plans in milliseconds.

Epochs: the units a builder emits while it consumes epoch e's documents are epoch e's; its state
(a partial unit) carries into the next epoch, as the streaming loader's did. Within an epoch the
first unit stays first (it may continue the previous epoch) and the others are shuffled by a keyed
pseudo-random bijection (``permute``: no table, O(1) memory) -- a full shuffle of the epoch's samples.
Streams (XLNet's memory): the epoch's documents are cut into ``streams`` contiguous regions of equal
token count (Transformer-XL's batchify), each read by its own builder; the regions are dealt to the
streams in a permutation per epoch, and a stream's units stay in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from glm_dist.data.documents import DocumentOrder
from glm_dist.data.shards import Doc, ShardSetError

ADDRESS = np.int64(1 << 62)
DOC_SHIFT = 32
TOKEN_MASK = (1 << DOC_SHIFT) - 1
MAX_DOCS = 1 << 29  # document ids fit bits 32..60 of an address
MAX_EMPTY_EPOCHS = 1000  # a split that yields no unit in this many epochs is too small for the unit
SHUFFLE_TAG, STREAM_TAG = 0x5A3F, 0x57AE  # RNG domains of the sample and stream permutations
ROUNDS = 6


def address_doc(table, doc: int, first: int = 0, end: int | None = None) -> Doc:
    """Document ``doc`` (tokens [first, end)) with token addresses for tokens and its sentence starts."""
    n = int(table.num_tokens[doc])
    end = n if end is None else end
    base = int(ADDRESS) | (doc << DOC_SHIFT)
    starts = table.sentence_starts(doc)
    if first or end < n:
        starts = starts[(starts >= first) & (starts < end)] - first
        if not len(starts) or starts[0] != 0:
            starts = np.concatenate([[0], starts]).astype(np.int64)
    return Doc(str(doc), np.arange(base + first, base + end, dtype=np.int64), starts)


# -- runs and the unit codec --------------------------------------------------------------------------
def to_runs(values: np.ndarray) -> np.ndarray:
    """(R, 3) runs ``value, length, step`` (step in {-1, 0, 1}) whose expansion is ``values``: a run
    ends where the difference to the next value changes or exceeds 1."""
    a = np.asarray(values, dtype=np.int64)
    if len(a) < 2:
        return np.stack([a, np.ones_like(a), np.zeros_like(a)], axis=1)
    d = np.diff(a)
    small = np.abs(d) <= 1
    cut = ~small | np.concatenate([[False], (d[1:] != d[:-1]) & small[:-1]])  # between i and i + 1
    starts = np.concatenate([[0], np.flatnonzero(cut) + 1])
    lengths = np.diff(np.concatenate([starts, [len(a)]]))
    steps = np.where(lengths > 1, d[np.minimum(starts, len(d) - 1)], 0)
    return np.stack([a[starts], lengths, steps], axis=1)


def from_runs(runs: np.ndarray) -> np.ndarray:
    lengths = runs[:, 1]
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.repeat(runs[:, 0], lengths) + np.repeat(runs[:, 2], lengths) * offsets


@dataclass(frozen=True)
class EncodedUnit:
    """A unit's structure (``tree``) and its leaves: runs for 1-D integer arrays, scalars as they are."""

    tree: tuple
    leaves: tuple


def encode(unit, consts: list) -> EncodedUnit:
    leaves: list = []
    return EncodedUnit(_encode(unit, leaves, consts), tuple(leaves))


def _encode(x, leaves: list, consts: list) -> tuple:
    if isinstance(x, np.ndarray) and x.ndim == 1 and x.dtype.kind in "iub":
        leaves.append(to_runs(x))
        return ("a", x.dtype.str)
    if isinstance(x, np.ndarray):  # a table shared by every unit (ELMo's characters): kept by identity
        index = next((i for i, c in enumerate(consts) if c is x), None)
        if index is None:
            consts.append(x)
            index = len(consts) - 1
        return ("c", index)
    if x is None:
        return ("n",)
    if isinstance(x, (bool, int, np.integer, np.bool_)):
        leaves.append(x)
        return ("s",)
    if isinstance(x, tuple):
        return ("t", tuple(_encode(v, leaves, consts) for v in x))
    if isinstance(x, dict):
        return ("d", tuple(x), tuple(_encode(v, leaves, consts) for v in x.values()))
    raise TypeError(f"a unit holds a {type(x).__name__}, which the sample index cannot plan")


def unit_arrays(unit: EncodedUnit) -> list[np.ndarray]:
    """The expanded values of the unit's array leaves (addresses and literal tokens)."""
    return [from_runs(leaf) for leaf in unit.leaves if isinstance(leaf, np.ndarray)]


def unit_pieces(unit: EncodedUnit) -> np.ndarray:
    """(P, 3) document pieces the unit packs: doc, first token, token count (one per address run)."""
    runs = np.concatenate(
        [np.zeros((0, 3), dtype=np.int64)] + [leaf for leaf in unit.leaves if isinstance(leaf, np.ndarray)]
    )
    runs = runs[runs[:, 0] >= ADDRESS]
    key = runs[:, 0] - ADDRESS
    first = np.where(runs[:, 2] < 0, (key & TOKEN_MASK) - runs[:, 1] + 1, key & TOKEN_MASK)
    return np.stack([key >> DOC_SHIFT, first, runs[:, 1]], axis=1)


def rebuild(unit: EncodedUnit, arrays: Iterator[np.ndarray], consts: list):
    """The unit with its array leaves replaced by ``arrays`` (resolved tokens), in order."""
    leaves = iter(unit.leaves)
    return _rebuild(unit.tree, leaves, arrays, consts)


def _rebuild(tree: tuple, leaves: Iterator, arrays: Iterator[np.ndarray], consts: list):
    kind = tree[0]
    if kind == "a":
        next(leaves)
        out = next(arrays)
        return out if out.dtype.names else out.astype(tree[1], copy=False)
    if kind == "c":
        return consts[tree[1]]
    if kind == "n":
        return None
    if kind == "s":
        return next(leaves)
    if kind == "t":
        return tuple(_rebuild(t, leaves, arrays, consts) for t in tree[1])
    return {k: _rebuild(t, leaves, arrays, consts) for k, t in zip(tree[1], tree[2])}


# -- the shuffle ---------------------------------------------------------------------------------------
def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64, wrapping)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def permute(index: np.ndarray, n: int, key: list[int]) -> np.ndarray:
    """A keyed pseudo-random bijection of range(n) at ``index``: a balanced Feistel network on the
    smallest even bit width holding n, cycle-walked back into range."""
    index = np.asarray(index, dtype=np.int64)
    if n <= 1:
        return np.zeros_like(index)
    half = max(1, ((n - 1).bit_length() + 1) // 2)
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)
    keys = np.random.default_rng(key).integers(0, 2**63 - 1, size=ROUNDS, dtype=np.int64).astype(np.uint64)
    x, todo = index.astype(np.uint64), np.ones(len(index), dtype=bool)
    with np.errstate(over="ignore"):
        while todo.any():
            left, right = x[todo] >> shift, x[todo] & mask
            for k in keys:
                left, right = right, left ^ (_mix(right ^ k) & mask)
            x[todo] = (left << shift) | right
            todo = x >= np.uint64(n)
    return x.astype(np.int64)


# -- the plans -------------------------------------------------------------------------------------------
class PackedPlan:
    """``TokenPacker``'s rule in closed form: an epoch's documents, each followed by the separator,
    are a stream of T positions, epochs follow one another, and unit k is positions
    [k·stride, k·stride + block), belonging to the epoch it ends in."""

    streams = 1
    consts: list = []  # its units hold no shared table

    def __init__(self, order: DocumentOrder, *, block: int, stride: int, sep: int | None):
        self.order, self.block, self.stride, self.sep = order, block, stride, sep
        self.extra = 0 if sep is None else 1
        self.total = order.tokens(self.extra)

    def start(self, epoch: int, stream: int = 0) -> int:
        """Global index of epoch ``epoch``'s first unit."""
        return max(0, -(-(epoch * self.total - self.block + 1) // self.stride))

    def epoch_of(self, k: int, stream: int = 0) -> int:
        return (k * self.stride + self.block - 1) // self.total

    def unit(self, epoch: int, i: int, stream: int = 0) -> EncodedUnit:
        first = (self.start(epoch) + i) * self.stride
        runs = []
        for x in range(first // self.total, (first + self.block - 1) // self.total + 1):
            lo, hi = max(first - x * self.total, 0), min(first + self.block - x * self.total, self.total)
            for doc, a, b in self.order.slices(x, lo, hi, self.extra):
                n = int(self.order.table.num_tokens[doc])
                if a < n:
                    runs.append((int(ADDRESS) | (doc << DOC_SHIFT) | a, min(b, n) - a, 1))
                if b > n:
                    runs.append((self.sep, 1, 0))
        return EncodedUnit(("a", "<i8"), (np.asarray(runs, dtype=np.int64).reshape(-1, 3),))


class _EpochEnd(Exception):
    """Raised into a builder when an epoch's documents run out (its state stays as it was)."""


def _until_end(docs: Iterator[Doc]) -> Iterator[Doc]:
    yield from docs
    raise _EpochEnd


class BuiltPlan:
    """Any builder's rule run over address documents, epoch by epoch (see the module docstring).
    ``make_builders()`` gives one builder per stream; ``rng_for(epoch)`` their planning RNGs;
    ``cache`` (data/plan_cache.py) keeps planned epochs for later runs."""

    def __init__(
        self,
        order: DocumentOrder,
        make_builders: Callable[[], list],
        rng_for: Callable,
        *,
        seed: int,
        shuffle: bool,
        cache=None,
    ):
        self.order, self.make_builders, self.rng_for = order, make_builders, rng_for
        self.seed, self.shuffle, self.cache = seed, shuffle, cache
        self.streams = len(make_builders())
        self.consts: list = []
        self.counts: dict[int, list[int]] = {}  # per planned epoch, units per stream
        self.ends: dict[int, list[dict]] = {}  # per planned epoch, each builder's state after it
        self._units: dict[int, list[list[EncodedUnit]]] = {}  # the last epochs planned
        if self.streams > 1 and order.tokens() < self.streams:
            raise ShardSetError(f"the split has {order.tokens()} tokens, fewer than its {self.streams} streams")

    def epoch_units(self, epoch: int) -> list[list[EncodedUnit]]:
        if epoch not in self._units:
            first = max((e + 1 for e in self.ends if e < epoch), default=0)
            for e in range(first, epoch + 1):  # planned in order: each starts from the last one's state
                self._plan(e)
        return self._units[epoch]

    def _plan(self, epoch: int) -> None:
        cached = self.cache.load(epoch, self.consts) if self.cache is not None else None
        if cached is not None:
            units, ends = cached
        else:
            builders = self.make_builders()
            for builder, state in zip(builders, self.ends[epoch - 1] if epoch else []):
                builder.load_state_dict(state)
            units = [self._run(b, epoch, builder) for b, builder in enumerate(builders)]
            ends = [builder.state_dict() for builder in builders]
            if self.cache is not None:
                self.cache.save(epoch, units, ends, self.consts)
        self.counts[epoch], self.ends[epoch] = [len(u) for u in units], ends
        self._units = {k: v for k, v in self._units.items() if k == epoch - 1}  # the current and previous epoch
        self._units[epoch] = units

    def _run(self, stream: int, epoch: int, builder) -> list[EncodedUnit]:
        out = []
        gen = builder.units(_until_end(self._docs(epoch, stream)), self.rng_for(epoch))
        try:
            for unit in gen:
                out.append(encode(unit, self.consts))
        except _EpochEnd:
            pass
        return out

    def _docs(self, epoch: int, stream: int) -> Iterator[Doc]:
        table = self.order.table
        if self.streams == 1:
            return (address_doc(table, d) for d in self.order.docs(epoch))
        size = self.order.tokens() // self.streams
        region = int(self.region_order(epoch)[stream])
        return (address_doc(table, d, a, b) for d, a, b in self.order.slices(epoch, region * size, (region + 1) * size))

    def region_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.streams)
        return np.random.default_rng([self.seed, STREAM_TAG, epoch]).permutation(self.streams)

    def _count(self, epoch: int, stream: int) -> int:
        if epoch not in self.counts:
            self.epoch_units(epoch)
        return self.counts[epoch][stream]

    def start(self, epoch: int, stream: int = 0) -> int:
        return sum(self._count(e, stream) for e in range(epoch))

    def epoch_of(self, k: int, stream: int = 0) -> int:
        epoch, seen, empty = 0, 0, 0
        while seen + self._count(epoch, stream) <= k:
            empty = empty + 1 if self._count(epoch, stream) == 0 else 0
            if empty > MAX_EMPTY_EPOCHS:
                raise ShardSetError(
                    f"{MAX_EMPTY_EPOCHS} epochs of the split gave no training unit: it holds too "
                    f"few tokens ({self.order.tokens()}) for one unit; use more data or a shorter "
                    f"data.seq_len"
                )
            seen += self._count(epoch, stream)
            epoch += 1
        return epoch

    def unit(self, epoch: int, i: int, stream: int = 0) -> EncodedUnit:
        return self.epoch_units(epoch)[stream][i]


@dataclass(frozen=True)
class Located:
    epoch: int
    unit_id: int  # the unit's index among its epoch's units, in the order the builder emitted them
    unit: EncodedUnit


class SampleIndex:
    """Global sample g -> its unit: epochs in order, the units of an epoch shuffled (first one kept)."""

    def __init__(self, plan, *, seed: int, shuffle: bool):
        self.plan, self.seed, self.shuffle = plan, seed, shuffle

    def epoch_of(self, g: int) -> int:
        return self.plan.epoch_of(g)

    def unit_id(self, g: int) -> tuple[int, int]:
        epoch = self.plan.epoch_of(g)
        start = self.plan.start(epoch)
        position, n = g - start, self.plan.start(epoch + 1) - start
        if not self.shuffle or position == 0:
            return epoch, position
        return epoch, 1 + int(permute(np.asarray([position - 1]), n - 1, [self.seed, SHUFFLE_TAG, epoch])[0])

    def locate(self, g: int) -> Located:
        epoch, i = self.unit_id(g)
        return Located(epoch, i, self.plan.unit(epoch, i))


class StreamIndex:
    """(stream b, step s) -> stream b's unit s: each stream's units in order, over the epochs."""

    def __init__(self, plan: BuiltPlan):
        self.plan = plan

    def epoch_of(self, stream: int, step: int) -> int:
        return self.plan.epoch_of(step, stream)

    def locate(self, stream: int, step: int) -> Located:
        epoch = self.plan.epoch_of(step, stream)
        i = step - self.plan.start(epoch, stream)
        return Located(epoch, i, self.plan.unit(epoch, i, stream))
