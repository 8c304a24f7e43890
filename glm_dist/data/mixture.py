"""Data mixtures: several token shard sets drawn into one training stream at set rates (GPT-3's
weighted sources, T5's mixing rates), keeping the loader's guarantees (docs/architecture.md, decision 12).

*Weights.* ``data.mixing=weights`` takes each source's ``weight`` (share of the training tokens) or
``epochs`` (weight = epochs x its size / the tokens the run draws); ``proportional`` gives each the
share min(size, K) / sum (T5 section 3.5.2, K = ``data.mixing_cap``); ``temperature`` raises those
shares to 1/T and renormalises. A size is the tokens of the source's training split.

*The blended index.* Global sample g goes to one source: the k-th sample of source s is due at time
(k + 1/2) / w_s, and the samples are taken in order of due time (ties to the lower source index) --
stride scheduling, which keeps what Megatron's greedy blend (each next sample to the source furthest
below its share) keeps: each source's count among the first g samples stays within a sample or so of
w_s x g (less than 1/2 + N w_s / 2 for N sources). Unlike the greedy loop it has a closed form: the
weights are integers (shares x 2^32) and the times are compared exactly, so the number of source s's
samples among the first g is a binary search, for any g, with no state. Every rank computes the
step's assignment alone, and resume (at any data-parallel size) lands on the same next sample. Each
source keeps its own sample index (its own per-epoch reshuffle, seeded by the run's seed and its
name): a source that runs out starts its next epoch without moving any other source's samples.

*Streams* (XLNet's memory): stream b takes blend positions b, b + 1, ... one per step, and its
position of source s is the next unit of source s's own stream b (its regions, in order). Each
stream draws its next unit from the mixture, every step mixes the sources by their weights, and
everything stays a closed form of (stream, step).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from data_pipeline.tokenize.tokenizer_file import parse_tokenizer
from glm_common.config_yaml import ConfigError
from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES
from glm_dist.config.mixture import MixtureSource, check_weight_sum, mixture_sources
from glm_dist.config.schema import DataConfig
from glm_dist.data.shards import ShardSetError, open_shard_file, read_manifest

WEIGHT_SCALE = 2**32  # a weight's integer resolution: shares exact to 2.3e-10
log = logging.getLogger(__name__)


class BlendedIndex:
    """Global sample -> (source, its sample number) for integer weights ``scaled`` (see the module docstring)."""

    def __init__(self, scaled: list[int]):
        if not scaled or min(scaled) < 1:
            raise ValueError(f"blend weights must be positive integers, got {scaled}")
        self.w = [int(x) for x in scaled]

    def _before(self, s: int, k: int, r: int) -> int:
        """Samples of source r due before source s's k-th: j with (2j+1)/w_r < (2k+1)/w_s (<= for r < s)."""
        if r == s:
            return k
        num, den = (2 * k + 1) * self.w[r] - self.w[s], 2 * self.w[s]  # j < num/den (j <= num/den for r < s)
        return max(0, -(-num // den) if r > s else num // den + 1)

    def rank(self, s: int, k: int) -> int:
        """The global sample number of source s's k-th sample."""
        return sum(self._before(s, k, r) for r in range(len(self.w)))

    def counts(self, g: int) -> list[int]:
        """(sources,) samples of each source among global samples [0, g)."""
        out = []
        for s in range(len(self.w)):
            lo, hi = 0, g  # the first k whose rank is >= g
            while lo < hi:
                mid = (lo + hi) // 2
                if self.rank(s, mid) < g:
                    lo = mid + 1
                else:
                    hi = mid
            out.append(lo)
        return out

    def assign(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(n,) source and (n,) its sample number of global samples [start, start + n)."""
        first, last = self.counts(start), self.counts(start + n)
        due = [(s, k) for s in range(len(self.w)) for k in range(first[s], last[s])]
        due.sort(key=lambda sk: self.rank(*sk))
        return (
            np.asarray([s for s, _ in due], dtype=np.int64).reshape(n),
            np.asarray([k for _, k in due], dtype=np.int64).reshape(n),
        )

    def stream_assign(self, step: int, streams: int) -> tuple[np.ndarray, np.ndarray]:
        """XLNet's streams: stream b's t-th unit is blend position b + t, so step t's rows are
        positions [t, t + B) (each step mixed by the weights) and each stream's sources follow the
        blend too. (B,) each stream's source at step ``step`` and (B,) its unit number in that
        source's stream b: the source's positions among [b, b + t)."""
        sources, numbers = self.assign(step, streams)
        return sources, numbers - self._before_window(0, streams)[np.arange(streams), sources]

    def stream_counts(self, steps: int, streams: int) -> list[int]:
        """(sources,) units of each source in the first ``steps`` steps of ``streams`` streams:
        sum_b counts(b + t) - counts(b), from two windows of B positions."""
        window = self._before_window(steps, streams).sum(axis=0) - self._before_window(0, streams).sum(axis=0)
        return (streams * np.asarray(self.counts(steps), dtype=np.int64) + window).tolist()

    def _before_window(self, start: int, n: int) -> np.ndarray:
        """(n, sources) each source's positions among [start, start + b) for b < n."""
        sources, _ = self.assign(start, n)
        onehot = np.eye(len(self.w), dtype=np.int64)[sources]
        return np.cumsum(onehot, axis=0) - onehot


@dataclass(frozen=True)
class Mixture:
    """The resolved sources of a run: what the loader draws from (picklable, for worker processes)."""

    names: tuple[str, ...]
    shards_dirs: tuple[str, ...]
    sizes: tuple[int, ...]  # tokens of each training split
    weights: tuple[float, ...]  # shares of the training samples, summing to 1

    @cached_property
    def blend(self) -> BlendedIndex:
        return BlendedIndex(scaled_weights(self.weights))

    def seed(self, run_seed: int, s: int) -> int:
        """Source s's data seed: by name, so adding or reordering sources never reshuffles another."""
        digest = hashlib.sha256(f"{run_seed}/{self.names[s]}".encode()).digest()
        return int.from_bytes(digest[:4], "little")

    def drawn(self, samples: int, seq_len: int, *, streams: int = 1) -> dict[str, dict[str, float]]:
        """Per source, the tokens the first ``samples`` global samples draw and the epochs that makes
        (tokens drawn / tokens available), exactly; ``streams`` > 1: drawn as that many XLNet streams
        (a loader's saved position holds both)."""
        counts = self.blend.stream_counts(samples // streams, streams) if streams > 1 else self.blend.counts(samples)
        return {
            name: {"tokens": k * seq_len, "epochs": k * seq_len / size}
            for name, k, size in zip(self.names, counts, self.sizes)
        }

    def state(self) -> dict:
        """What a saved data position depends on: resuming with other sources or weights is refused."""
        return {"names": list(self.names), "weights": scaled_weights(self.weights)}


def scaled_weights(weights: tuple[float, ...] | list[float]) -> list[int]:
    return [max(1, round(w * WEIGHT_SCALE)) for w in weights]


def mixing_weights(sizes: list[int], *, mixing: str, cap: int | None = None, temperature: float = 1.0) -> list[float]:
    """T5's mixing rates (section 3.5.2): proportional r_s = min(size_s, K) / sum_j min(size_j, K);
    temperature r_s^(1/T), renormalised."""
    capped = [min(size, cap) if cap else size for size in sizes]
    rates = [c / sum(capped) for c in capped]
    if mixing == "temperature":
        rates = [r ** (1.0 / temperature) for r in rates]
        rates = [r / math.fsum(rates) for r in rates]
    return rates


def source_size(manifest: dict) -> int:
    """Tokens of a shard set's training split (its manifest's count: no shard is read)."""
    return sum(int(e["num_tokens"]) for e in manifest["splits"].get("train", []))


def resolve_mixture(data: DataConfig, *, total_tokens: int, where: str = "") -> Mixture:
    """The config's sources with their sizes and weights (each shard set's manifest read; none built).
    ``total_tokens``: what the run draws (max_steps x global batch x seq_len), for ``epochs`` sources."""
    sources = mixture_sources(data, where)
    manifests = [_manifest(s) for s in sources]
    check_tokenizers(sources, manifests)
    sizes = [source_size(m) for m in manifests]
    for s, size in zip(sources, sizes):
        if size == 0:
            raise ShardSetError(
                f"data.mixture source {s.name!r} ({s.shards_dir}) has no training tokens: "
                f"rebuild it from a non-empty source or leave it out"
            )
    if data.mixing != "weights":
        weights = mixing_weights(sizes, mixing=data.mixing, cap=data.mixing_cap, temperature=data.mixing_temperature)
        if min(weights) <= 0:
            raise ConfigError(
                f"data.mixing_temperature={data.mixing_temperature} leaves a source a weight of 0 ({where}): raise it"
            )
    else:
        shares = [
            s.weight if s.weight is not None else s.epochs * size / total_tokens for s, size in zip(sources, sizes)
        ]
        weights = check_weight_sum(shares, normalize=data.normalize_weights, where=where)
    return Mixture(tuple(s.name for s in sources), tuple(s.shards_dir for s in sources), tuple(sizes), tuple(weights))


def _manifest(source: MixtureSource) -> dict:
    try:
        return read_manifest(source.shards_dir)
    except (OSError, ValueError) as err:
        raise ShardSetError(
            f"data.mixture source {source.name!r}: no usable shard set at {source.shards_dir} "
            f"({err}); give it a source to tokenize, or run glm data tokenize"
        ) from None


def tokenizer_identity(manifest: dict) -> str:
    t = manifest["tokenizer"]
    return f"{t.get('profile', '?')} {t.get('kind', '?')}, {t['vocab_size']} tokens, sha256 {t['sha256'][:12]}"


def canonical_tokenizer(shards_dir: str, manifest: dict) -> str:
    """A shard set's tokenizer.json as the tokenizers library writes it once loaded: a freshly trained
    Unigram's scores print otherwise than the same scores read back, so the first source's file and
    the copy its tokenizer.json made for another source differ in bytes (and sha256) only."""
    path = f"{shards_dir}/{manifest['tokenizer']['file']}"
    with open_shard_file(path) as f:
        data = f.read(MAX_TOKENIZER_BYTES)
    return parse_tokenizer(data, where=path, fix="rebuild that source's shard set with glm data tokenize").to_str()


def check_tokenizers(sources: list[MixtureSource], manifests: list[dict]) -> None:
    """Every source's tokens come from one tokenizer (the first source's)."""
    first = manifests[0]["tokenizer"]["sha256"]
    for s, m in zip(sources[1:], manifests[1:]):
        if m["tokenizer"]["sha256"] != first and (
            canonical_tokenizer(s.shards_dir, m) != canonical_tokenizer(sources[0].shards_dir, manifests[0])
        ):
            raise ConfigError(
                f"data.mixture sources {sources[0].name!r} and {s.name!r} use different tokenizers "
                f"({tokenizer_identity(manifests[0])} vs {tokenizer_identity(m)}): rebuild "
                f"{s.shards_dir} with {sources[0].shards_dir}/tokenizer.json"
            )


def build_missing(data: DataConfig) -> None:
    """Tokenize each source whose shard set is missing: the first with data.tokenizer / data.tokenizer_profile
    (as a single-source run), the others with the first's tokenizer.json."""
    from data_pipeline.tokenize.prepare import prepare_shards

    sources = mixture_sources(data)
    tokenizer = data.tokenizer
    for i, s in enumerate(sources):
        if not (Path(s.shards_dir) / "manifest.json").exists():
            if s.source is None:
                raise ShardSetError(
                    f"data.mixture source {s.name!r}: {s.shards_dir} holds no shard set and the "
                    f"source gives no 'source' to build it from"
                )
            log.info("tokenizing data.mixture source %r (%s) into %s", s.name, s.source, s.shards_dir)
            prepare_shards(
                source=s.source,
                out_dir=s.shards_dir,
                tokenizer=tokenizer,
                profile=data.tokenizer_profile,
                workers=data.encode_workers,
                vocab_size=data.vocab_size,
                val_per_mille=data.val_per_mille,
                shard_max_bytes=data.shard_max_bytes,
                text_field=data.text_field,
                max_record_mb=data.max_record_mb,
            )
        if i == 0:
            tokenizer = f"{s.shards_dir}/{read_manifest(s.shards_dir)['tokenizer']['file']}"


def repeat_warnings(epochs: dict[str, float], limit: float) -> list[str]:
    """A line per source repeated more than ``limit`` times (its name -> epochs drawn)."""
    return [
        f"data.mixture source {name!r} is repeated {n:.2f} times, more than data.max_epochs_warning={limit:g} "
        f"(repeated tokens are worth less than new ones: Muennighoff et al. 2023); lower its weight or add data"
        for name, n in epochs.items()
        if n > limit
    ]


def run_mixture(
    data: DataConfig, *, samples: int, seq_len: int, own_loader: bool = False, where: str = ""
) -> Mixture | None:
    """A training run's mixture (None: one shard set), resolved for ``samples`` global samples of
    ``seq_len`` tokens, with a warning per source it repeats more than data.max_epochs_warning.
    ``own_loader``: the objective schedules its own batches from one set's splits (CVT), refused."""
    if not data.mixture:
        return None
    if own_loader:
        raise ConfigError(
            f"data.mixture ({where}) feeds objectives that read token shards; this objective "
            f"alternates the splits of one shard set: give it data.shards_dir instead"
        )
    mixture = resolve_mixture(data, total_tokens=samples * seq_len, where=where)
    drawn = mixture.drawn(samples, seq_len)
    for line in repeat_warnings({name: row["epochs"] for name, row in drawn.items()}, data.max_epochs_warning):
        log.warning(line)
    return mixture
