"""``data.mixture``'s sources as typed records, checked from the config's values alone.

Each entry of the YAML list becomes a :class:`MixtureSource`, built strictly: an unknown key, a
missing name or shard set, both or neither of ``weight`` and ``epochs``, a share that is not a
positive finite number, two sources of one name, or explicit weights that do not sum to 1 (unless
``data.normalize_weights``) is one ``ConfigError`` line naming the entry and the file that set it.
This runs when the config loads (``glm config show`` refuses it); what needs the shard sets -- their
sizes, their tokenizers, the weights of ``epochs`` sources and of proportional or temperature mixing
-- is ``glm_dist/data/mixture.py``'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Real
from typing import Any, Optional

from data_pipeline.remote import check_scheme
from data_pipeline.sources import check_source
from glm_common.config_yaml import ConfigError, source_of

SUM_TOLERANCE = 1e-6  # weights written to a few decimals (0.6, 0.22, 0.08, 0.08, 0.02) add up within this


@dataclass(frozen=True)
class MixtureSource:
    name: str  # how tables, metrics and the batch's "source" ids name it
    shards_dir: str  # its token shard set
    source: Optional[str] = None  # raw input tokenized into shards_dir (with the mixture's tokenizer) when missing
    weight: Optional[float] = None  # its share of the training tokens
    epochs: Optional[float] = None  # or: how many passes over it the run makes (its weight follows from its size)


KEYS = tuple(f.name for f in dataclasses.fields(MixtureSource))


def mixture_sources(data: Any, where: str = "") -> list[MixtureSource]:
    """``data.mixture`` (a list of dicts) as sources; ``where``: the file that set it, for messages."""
    if not isinstance(data.mixture, list):
        raise ConfigError(f"data.mixture must be a list of sources ({where})")
    sources = [_source(i, item, data.mixing, where) for i, item in enumerate(data.mixture)]
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(
            f"data.mixture names source(s) {', '.join(map(repr, twice))} more than once ({where}): "
            f"give each source its own name"
        )
    if sources and all(s.weight is not None for s in sources):
        check_weight_sum([s.weight for s in sources], normalize=data.normalize_weights, where=where)
    return sources


def _source(i: int, item: Any, mixing: str, where: str) -> MixtureSource:
    key = f"data.mixture[{i}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{key} = {item!r} must be a mapping with keys {', '.join(KEYS)} ({where})")
    unknown = sorted(set(item) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(map(repr, unknown))} in {key} ({where}); a source has {', '.join(KEYS)}"
        )
    for text in ("name", "shards_dir", "source"):
        value = item.get(text)
        if (text != "source" or value is not None) and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"{key}.{text} = {value!r} must be a non-empty string ({where})")
    for location in ("shards_dir", "source"):
        try:
            if item.get(location) is not None:
                check = check_source if location == "source" else check_scheme  # manpages:/path is a name
                check(item[location], f"{key}.{location}")
        except ValueError as err:
            raise ConfigError(f"{err} ({where})") from None
    shares = [k for k in ("weight", "epochs") if item.get(k) is not None]
    if mixing == "weights" and len(shares) != 1:
        raise ConfigError(
            f"{key} ({item['name']!r}) must give exactly one of weight (its share of the tokens) and "
            f"epochs (passes over it), got {' and '.join(shares) or 'neither'} ({where})"
        )
    if mixing != "weights" and shares:
        raise ConfigError(
            f"{key} ({item['name']!r}) gives {shares[0]}, but data.mixing={mixing} computes every "
            f"weight from the sources' sizes: remove it, or set data.mixing=weights ({where})"
        )
    for share in shares:
        value = _number(item[share])
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{key}.{share} = {value!r} ({item['name']!r}) must be a number > 0 ({where})")
    return MixtureSource(
        **{k: (float(_number(v)) if k in ("weight", "epochs") and v is not None else v) for k, v in item.items()}
    )


def _number(value: Any) -> Any:
    """YAML 1.1 reads ``5e-1`` (no dot) as a string; a share reads it as the number it is, as every float key
    of the config does (glm_common/config_yaml.py)."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value


def check_weight_sum(weights: list[float], *, normalize: bool, where: str = "") -> list[float]:
    """The weights as shares summing to 1: refused when they do not, unless ``normalize``."""
    total = math.fsum(weights)
    if abs(total - 1.0) > SUM_TOLERANCE and not normalize:
        raise ConfigError(
            f"data.mixture's weights sum to {total:.6g}, not 1 ({where}): correct them, or set "
            f"data.normalize_weights=true to divide each by the sum"
        )
    return [w / total for w in weights]


def check_mixture(cfg: Any) -> None:
    """Refuse a malformed ``data.mixture`` of a loaded config (one line naming the file)."""
    if cfg.data.mixture:
        mixture_sources(cfg.data, source_of(cfg, "data.mixture"))
