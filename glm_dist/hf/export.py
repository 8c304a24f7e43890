"""``glm export-hf``: a checkpoint -> a transformers folder, one adapter per family."""
from __future__ import annotations

from pathlib import Path

from glm_dist.eval.run import load_checkpoint_model
from glm_dist.hf import bart, bert, gpt2, t5

ADAPTERS = {"gpt": gpt2.export_hf, "bert": bert.export_hf, "roberta": bert.export_hf, "albert": bert.export_hf,
            "electra": bert.export_hf, "t5": t5.export_hf, "bart": bart.export_hf}


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    model, meta = load_checkpoint_model(checkpoint)
    family = meta["model_family"]
    if family not in ADAPTERS:
        raise ValueError(f"no transformers export for model family {family!r} yet")
    tokenizer = Path(checkpoint) / "tokenizer.json"
    extra = {} if family == "gpt" else {"profile": meta["config"]["data"]["tokenizer_profile"]}
    if family == "electra":  # the discriminator is what ELECTRA fine-tunes from
        model = model.discriminator
    ADAPTERS[family](model.cfg, model.state_dict(), str(out_dir),
                     tokenizer_file=str(tokenizer) if tokenizer.exists() else None, **extra)
    return Path(out_dir)
