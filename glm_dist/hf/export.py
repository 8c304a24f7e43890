"""``glm export-hf``: a checkpoint -> a transformers folder, through the family's adapter."""

from __future__ import annotations

import tempfile
from pathlib import Path

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.checkpoint.errors import checkpoint_storage
from glm_dist.checkpoint.files import MAX_TOKENIZER_BYTES
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.registry import exported_module, family, resolve


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    model, meta = load_checkpoint_model(checkpoint)
    name = meta["model_family"]
    spec = family(name)
    if spec.hf is None:
        raise ValueError(f"no transformers export for model family {name!r} yet")
    part = exported_module(name, model)  # e.g. ELECTRA's discriminator, what is fine-tuned
    with tempfile.TemporaryDirectory() as tmp:  # the checkpoint's tokenizer (local or remote) as a file
        tokenizer = Path(tmp) / "tokenizer.json"
        checkpoint_tokenizer(checkpoint)  # it parses (one line if not)
        tokenizer.write_bytes(checkpoint_storage(str(checkpoint)).read("tokenizer.json", max_bytes=MAX_TOKENIZER_BYTES))
        resolve(f"{spec.hf}:export_hf")(
            part.cfg,
            part.state_dict(),
            str(out_dir),
            tokenizer_file=str(tokenizer),
            profile=meta["config"]["data"]["tokenizer_profile"],
        )
    return Path(out_dir)
