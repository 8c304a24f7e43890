"""``glm finetune``: a pretrained checkpoint fine-tuned on a task's rows, as the task kind asks and the
checkpoint's family takes (``families/registry.py``: each family's ``finetune`` kinds and, where it
has one, its own recipe ``finetune_with``):

- classify (and pairs): an encoder's summary state and one new weight matrix (``transfer/classify.py``);
- span, tokens: BERT's token-level heads on any encoder and XLNet (``transfer/token_tasks.py``);
- seq2seq: T5 / BART text to text (``transfer/seq2seq.py``);
- GPT's recipe (``transfer/gpt.py``) and ULMFiT's classifier (``transfer/ulmfit.py``), their families'
  ``finetune_with``.

Rows are JSONL or CSV (``transfer/files.py``), tokenized with the checkpoint's own tokenizer; every
kind trains through the one loop of ``transfer/loop.py`` with the tricks of ``transfer/tricks.py``
(discriminative and slanted triangular rates, gradual unfreezing, adapters). The result is a dict
(printed as JSON); ``--out`` writes the weights beside it.
"""

from __future__ import annotations

import torch

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.registry import FAMILIES, exported_module, family, resolve
from glm_dist.parallel.distributed import init_distributed
from glm_dist.transfer.classify import classify
from glm_dist.transfer.files import finish, read_manifest_ids, read_rows, split_rows, train_valid_rows, write_output
from glm_dist.transfer.options import FinetuneArgs, FinetuneError
from glm_dist.transfer.seq2seq import text_to_text
from glm_dist.transfer.token_tasks import finetune_token_level

# what callers of glm finetune import from here (the command, tests, benchmarks)
__all__ = ["FinetuneArgs", "FinetuneError", "finetune", "read_manifest_ids", "read_rows", "split_rows", "write_output"]


def row_fields(args: FinetuneArgs) -> tuple[str, ...]:
    """The fields every row of a classification or text-to-text task holds."""
    return (args.text_field, *([args.pair_field] if args.pair_field else []), args.label_field)


def finetune(args: FinetuneArgs) -> dict:
    """Fine-tune ``args.checkpoint`` on ``args.train`` as ``args.task``; the result as a dict."""
    init_distributed()
    torch.manual_seed(args.seed)
    model, meta = load_checkpoint_model(args.checkpoint)
    name = meta["model_family"]
    spec = family(name)
    if args.task not in spec.finetune:
        able = [f for f, s in FAMILIES.items() if args.task in s.finetune]
        raise FinetuneError(
            f"glm finetune --task {args.task} takes {', '.join(able)} checkpoints; {args.checkpoint} "
            f"is a {name!r} checkpoint"
        )
    if args.task != "seq2seq":  # seq2seq trains the whole model as loaded, its LM head included
        model = exported_module(name, model)
    if args.task in ("span", "tokens"):
        return finetune_token_level(args, model, meta, pad_left=spec.pad_left, adapter_sites=spec.adapter_sites)
    if spec.finetune_with:  # the family's own recipe (GPT's, ULMFiT's)
        return resolve(spec.finetune_with)(args, model, meta)
    tok = checkpoint_tokenizer(args.checkpoint)
    ids = read_manifest_ids(tok, meta)
    if args.task == "seq2seq":
        return finish(
            args,
            text_to_text(
                args,
                model,
                tok,
                *train_valid_rows(args, row_fields(args)),
                ids=ids,
                start_role=spec.decoder_start,
                adapter_sites=spec.adapter_sites,
            ),
        )
    return finish(
        args,
        classify(
            args,
            model,
            tok,
            *train_valid_rows(args, row_fields(args)),
            pad_id=ids["pad"],
            pad_left=spec.pad_left,
            position=spec.summary_position,
            adapter_sites=spec.adapter_sites,
        ),
    )
