"""Make sure the run's shard sets exist: rank 0 builds them (from ``data.*``), the others wait."""

from __future__ import annotations

from pathlib import Path

from glm_dist.config.mixture import mixture_sources
from glm_dist.config.schema import DataConfig
from glm_dist.data.mixture import build_missing
from glm_dist.data.shards import read_manifest
from glm_dist.parallel import comm
from glm_dist.parallel.distributed import DistInfo


def run_shards_dir(data: DataConfig) -> str:
    """The shard set whose tokenizer the run uses: data.shards_dir, or a mixture's first source's."""
    return mixture_sources(data)[0].shards_dir if data.mixture else data.shards_dir


def ensure_shards(data: DataConfig, dist: DistInfo) -> dict:
    """The run's (first) shard set's manifest, every shard set built where missing."""
    if dist.is_main and data.mixture:
        build_missing(data)
    elif dist.is_main and not (Path(data.shards_dir) / "manifest.json").exists():
        from data_pipeline.tokenize.prepare import prepare_shards

        prepare_shards(
            source=data.source,
            out_dir=data.shards_dir,
            tokenizer=data.tokenizer,
            profile=data.tokenizer_profile,
            workers=data.encode_workers,
            vocab_size=data.vocab_size,
            val_per_mille=data.val_per_mille,
            shard_max_bytes=data.shard_max_bytes,
            text_field=data.text_field,
            max_record_mb=data.max_record_mb,
        )
    comm.barrier()
    return read_manifest(run_shards_dir(data))
