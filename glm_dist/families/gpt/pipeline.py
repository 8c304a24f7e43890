"""GPT cut into pipeline stages (its row's ``PipelineSpec``; the cutting is ``parallel/pipeline.py``'s).

The layer list -- ``GPTEmbedding``, ``n_layer`` x ``GPTBlock``, the final LayerNorm, the output
projection -- becomes layer specs of the same classes; the output projection is a tied copy of the
token embedding on the last stage, padded as it is (``model.pad_vocab_to_multiple_of``), whose logits
leave the padding out as ``GPTHead``'s do.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from glm_dist.families.gpt.model import GPT, GPTBlock, GPTConfig, GPTEmbedding, local_init_std
from glm_dist.models.common import VocabPlan, pad_vocab_rows
from glm_dist.ops.cross_entropy import real_logits, vocab_padding, vocab_split
from glm_dist.parallel.pipeline import TIED, build_pipeline, unpipelined_name
from glm_dist.parallel.tensor import model_vocab_split, output_logits


class TiedOutput(nn.Module):
    """The last stage's copy of the token embedding, used as the output projection."""

    VOCAB_PLAN = VocabPlan(embedding="wte")  # split by vocabulary like the first stage's embedding

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.d_model)  # the first stage's shape: one tied matrix
        pad_vocab_rows(self.wte, cfg.vocab_size)


def _logits(module: TiedOutput, x: torch.Tensor, *, padding: int) -> torch.Tensor:
    """(B, T, C) -> the logits the loss scores: the real vocabulary's (B, T, vocab), or -- the embedding
    split by vocabulary -- this rank's columns with the padding's at -inf: ``GPTHead``'s logits, from the
    padded matrix. The stage's forward runs outside the loss's ``vocab_split``, so it names its own."""
    with vocab_split(model_vocab_split(module)), vocab_padding(padding):
        return real_logits(output_logits(module.wte, x))


def gpt_source_name(key: str, n_layer: int) -> str | None:
    """GPT: the final LayerNorm follows the blocks."""
    return unpipelined_name(key, n_layer, {1: "head.ln_f."})


def gpt_pipeline(model: GPT, *, stages: int, loss_fn, **layout):
    """``layout``: topology, partition, checkpoint_interval, local_seed (``build_pipeline``)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    cfg = model.cfg
    # The embedding is its own forward (a module in DeepSpeed's layer list, so its weights are saved
    # with the checkpoint); the output projection reuses it through a function, and DeepSpeed
    # re-broadcasts the tied matrix from the first stage after a load.
    specs = [
        TiedLayerSpec(TIED, GPTEmbedding, cfg, tied_weight_attr=["wte.weight"]),
        *[LayerSpec(GPTBlock, cfg, i) for i in range(cfg.n_layer)],
        LayerSpec(nn.LayerNorm, cfg.d_model, eps=cfg.layer_norm_eps),
        TiedLayerSpec(
            TIED,
            TiedOutput,
            cfg,
            forward_fn=functools.partial(_logits, padding=cfg.padded_vocab_size - cfg.vocab_size),
            tied_weight_attr=["wte.weight"],
        ),
    ]
    return build_pipeline(
        model,
        specs,
        block=GPTBlock,
        rename=lambda key: gpt_source_name(key, cfg.n_layer),
        std=local_init_std,
        stages=stages,
        loss_fn=loss_fn,
        **layout,
    )
