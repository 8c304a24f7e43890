"""``glm eval``: validation loss, perplexity and bits per byte of a checkpoint, in one process (on the
GPU when there is one); for decoder-only LMs also whole held-out documents' token-, word- and
byte-level perplexity in sliding windows (``--documents N --stride S``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.profiles import special_ids
from glm_dist.checkpoint.consolidate import checkpoint_tokenizer, consolidated_state_dict
from glm_dist.checkpoint.files import CheckpointError
from glm_dist.config.checks import seq_len
from glm_dist.config.loader import source_of
from glm_dist.config.schema import Config
from glm_dist.data.loader import validation_batches
from glm_dist.data.mixture import Mixture, resolve_mixture
from glm_dist.data.prepare import run_shards_dir
from glm_dist.data.shards import read_manifest, read_shard, shard_sizes, shard_urls
from glm_dist.errors import GlmError
from glm_dist.eval.perplexity import (
    byte_length_table,
    document_perplexity,
    evaluate,
    evaluate_sources,
    gives_next_token_logits,
)
from glm_dist.families.registry import build_model, model_config_from_dict
from glm_dist.objectives.registry import get_objective, options_from_config


def load_checkpoint_model(checkpoint: str | Path) -> tuple[torch.nn.Module, dict]:
    """The checkpoint's model in fp32 on the CPU, with its meta.json."""
    sd, meta = consolidated_state_dict(checkpoint)
    model = build_model(meta["model_family"], model_config_from_dict(meta["model_family"], meta["model_config"]))
    model.load_state_dict(sd, strict=False)
    missing = set(model.state_dict()) - set(sd)
    if missing - {"head.lm_head.weight", "head.mlm.decoder.weight"}:  # a tied head may be stored once
        raise CheckpointError(f"checkpoint {checkpoint} lacks weights {sorted(missing)}")
    return model.eval(), meta


def evaluate_checkpoint(cfg: Config, checkpoint: str | Path, *, documents: int = 0, stride: int | None = None) -> dict:
    """The objective's validation metrics; for a decoder-only LM also the first ``documents``
    held-out documents' token / word / byte perplexity in sliding windows of ``stride``. A config with
    ``data.mixture``: each source's metrics on its own validation split and the mixture's
    (eval/perplexity.py evaluate_sources: the sources weighted as the run drew them), and the
    documents per source."""
    model, meta = load_checkpoint_model(checkpoint)
    shards_dir, mixture = run_shards_dir(cfg.data), checkpoint_mixture(cfg, meta)
    manifest = read_manifest(shards_dir)
    if manifest["tokenizer"]["sha256"] != meta["tokenizer_sha256"]:
        raise CheckpointError(
            f"checkpoint {checkpoint} was trained with another tokenizer than the one in "
            f"{shards_dir}; evaluate on shards made with the checkpoint's tokenizer.json"
        )
    tok = checkpoint_tokenizer(checkpoint)
    byte_lengths = byte_length_table(tok, model.cfg.vocab_size)
    batches = validation_batches(
        mixture or shards_dir,
        seq_len=min(seq_len(cfg), model.cfg.context_length),
        micro_batch_size=cfg.train.micro_batch_size,
        num_batches=cfg.train.eval_batches,
        objective=cfg.objective.name,
        options=options_from_config(cfg.objective, model.cfg),
    )
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    objective = get_objective(cfg.objective.name)
    model = model.to(device)

    def run(part: list) -> dict:
        return evaluate(model, part, byte_lengths=byte_lengths, device=device, objective=objective)

    metrics = (
        evaluate_sources(run, batches, names=mixture.names, weights=mixture.weights)
        if mixture is not None
        else run(batches)
    )
    metrics.update(
        objective.checkpoint_metrics(
            model,
            shards_dir=shards_dir,
            seq_len=seq_len(cfg),
            num_sequences=cfg.train.eval_batches * cfg.train.micro_batch_size,
            device=device,
        )
    )
    result = {"checkpoint": str(checkpoint), "step": meta["step"], "split": "validation", **metrics}
    if documents and gives_next_token_logits(meta["model_family"]):

        def scored(root: str) -> dict:
            return validation_documents_perplexity(
                model, tok, root, meta, limit=documents, stride=stride, device=device
            )

        result["documents"] = (
            scored(shards_dir)
            if mixture is None
            else {name: scored(root) for name, root in zip(mixture.names, mixture.shards_dirs)}
        )
    return result


def checkpoint_mixture(cfg: Config, meta: dict) -> Mixture | None:
    """The config's mixture (None: one shard set), weighted as the checkpoint's run drew it: an
    ``epochs`` source's weight follows from the tokens the run draws, its global batch taken at the
    checkpoint's data-parallel size."""
    if not cfg.data.mixture:
        return None
    dp_size = meta.get("layout", {}).get("data", 1)
    samples = cfg.train.max_steps * cfg.train.micro_batch_size * cfg.train.grad_accum_steps * dp_size
    return resolve_mixture(cfg.data, total_tokens=samples * seq_len(cfg), where=source_of(cfg, "data.mixture"))


def validation_documents_perplexity(
    model, tok: Tokenizer, shards_dir: str, meta: dict, *, limit: int, stride: int | None, device
) -> dict:
    """The first ``limit`` held-out documents scored whole, in sliding windows of the context
    advancing by ``stride`` (default: the context, disjoint windows)."""
    context = model.cfg.context_length
    if stride is not None and not 1 <= stride <= context:
        raise GlmError(f"--stride {stride} must be between 1 and the model's context length {context}")
    manifest, docs = read_manifest(shards_dir), []
    for url, expected in zip(shard_urls(shards_dir, manifest, "validation"), shard_sizes(manifest, "validation")):
        docs += [d.tokens for d in read_shard(url, expected) if len(d.tokens)][: limit - len(docs)]
        if len(docs) >= limit:
            break
    ids = special_ids(tok, meta["config"]["data"]["tokenizer_profile"])
    return document_perplexity(
        model,
        docs,
        tok,
        prefix_id=ids.get("eot", ids.get("eos")),
        context=context,
        stride=stride or context,
        device=device,
    )


def main_eval(cfg: Config, checkpoint: str, *, documents: int = 0, stride: int | None = None) -> None:
    print(json.dumps(evaluate_checkpoint(cfg, checkpoint, documents=documents, stride=stride), indent=2))
