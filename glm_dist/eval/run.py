"""``glm eval``: validation loss, perplexity and bits per byte of a checkpoint, in one process."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from glm_dist.config.checks import seq_len
from glm_dist.config.schema import Config
from glm_dist.data.loader import validation_batches
from glm_dist.data.shards import read_manifest
from glm_dist.eval.perplexity import byte_length_table, evaluate
from glm_dist.models.registry import build_model, model_config_from_dict
from glm_dist.train.checkpoint import CheckpointError, consolidated_state_dict


def load_checkpoint_model(checkpoint: str | Path) -> tuple[torch.nn.Module, dict]:
    """The checkpoint's model in fp32 on the CPU, with its meta.json."""
    sd, meta = consolidated_state_dict(checkpoint)
    model = build_model(meta["model_family"], model_config_from_dict(meta["model_family"], meta["model_config"]))
    model.load_state_dict(sd, strict=False)
    missing = set(model.state_dict()) - set(sd)
    if missing - {"head.lm_head.weight", "head.mlm.decoder.weight"}:  # a tied head may be stored once
        raise CheckpointError(f"checkpoint {checkpoint} lacks weights {sorted(missing)}")
    return model.eval(), meta


def evaluate_checkpoint(cfg: Config, checkpoint: str | Path) -> dict:
    model, meta = load_checkpoint_model(checkpoint)
    manifest = read_manifest(cfg.data.shards_dir)
    if manifest["tokenizer"]["sha256"] != meta["tokenizer_sha256"]:
        raise CheckpointError(f"checkpoint {checkpoint} was trained with another tokenizer than the one in "
                              f"{cfg.data.shards_dir}; evaluate on shards made with the checkpoint's tokenizer.json")
    tok = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    byte_lengths = byte_length_table(tok, model.cfg.vocab_size)
    batches = validation_batches(cfg.data.shards_dir, seq_len=min(seq_len(cfg), model.cfg.context_length),
                                 micro_batch_size=cfg.train.micro_batch_size, num_batches=cfg.train.eval_batches,
                                 objective=cfg.objective.name)
    metrics = evaluate(model, batches, byte_lengths=byte_lengths, objective=cfg.objective.name)
    return {"checkpoint": str(checkpoint), "step": meta["step"], "split": "validation", **metrics}


def main_eval(cfg: Config, checkpoint: str) -> None:
    print(json.dumps(evaluate_checkpoint(cfg, checkpoint), indent=2))
