"""Make sure the run's shard set exists: rank 0 builds it (from ``data.*``), the others wait."""
from __future__ import annotations

from pathlib import Path

from glm_dist.config.schema import DataConfig
from glm_dist.data.shards import read_manifest
from glm_dist.parallel import comm
from glm_dist.parallel.distributed import DistInfo


def ensure_shards(data: DataConfig, dist: DistInfo) -> dict:
    if dist.is_main and not (Path(data.shards_dir) / "manifest.json").exists():
        from data_pipeline.tokenize.prepare import prepare_shards

        prepare_shards(source=data.source, out_dir=data.shards_dir, tokenizer=data.tokenizer,
                       profile=data.tokenizer_profile, workers=data.encode_workers,
                       vocab_size=data.vocab_size, val_per_mille=data.val_per_mille,
                       shard_max_bytes=data.shard_max_bytes, text_field=data.text_field,
                       max_record_mb=data.max_record_mb)
    comm.barrier()
    return read_manifest(data.shards_dir)
