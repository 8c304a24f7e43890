"""The encoders (BERT / RoBERTa, MLM) cut into pipeline stages (their rows' ``PipelineSpec``; the
cutting is ``parallel/pipeline.py``'s).

Layer list: the embedding (tied), n_layer blocks, the MLM transform (dense, activation, LayerNorm),
the decoder projection (tied to the word embedding) and the decoder bias. Between stages travel the
hidden states and the (B, T) attention mask.
"""

from __future__ import annotations

import torch
from torch import nn

from glm_dist.families.bert.model import Encoder, EncoderBlock, EncoderEmbedding, _act, pipeline_refusal
from glm_dist.models.common import VocabPlan, normal_init_std
from glm_dist.parallel.pipeline import TIED, build_pipeline, unpipelined_name
from glm_dist.parallel.tensor import output_logits


class PipeEncoderBlock(EncoderBlock):
    """An encoder block that takes and returns (hidden, attention mask)."""

    def forward(self, inputs):
        x, mask = inputs
        return super().forward(x, mask.bool()[:, None, None, :]), mask


class MLMTransform(nn.Module):
    """The MLM head up to the decoder: dense -> activation -> LayerNorm (names as ``MLMHead``)."""

    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act = _act(cfg.activation)

    def forward(self, inputs):
        x, _ = inputs
        return self.ln(self.act(self.dense(x)))


class TiedWord(nn.Module):
    """The last stage's copy of the word embedding, used as the MLM decoder's weight."""

    VOCAB_PLAN = VocabPlan(embedding="word")

    def __init__(self, cfg):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.emb)


class DecoderBias(nn.Module):
    """The MLM decoder's vocabulary-sized bias, a layer of its own on the last stage."""

    VOCAB_PLAN = VocabPlan(biases=("bias",))

    def __init__(self, vocab_size: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, logits):
        return logits + self.bias


def _embed(module: EncoderEmbedding, inputs):
    ids, mask = inputs
    return module(ids), mask


def _decode(module: TiedWord, x):
    return output_logits(module.word, x)


def encoder_source_name(key: str, n_layer: int) -> str | None:
    """Encoder: the MLM transform, then (after the tied decoder weight) the decoder's bias."""
    return unpipelined_name(key, n_layer, {1: "head.mlm.", 3: "head.mlm.decoder."})


def encoder_pipeline(model: Encoder, *, stages: int, loss_fn, **layout):
    """``layout``: topology, partition, checkpoint_interval, local_seed (``build_pipeline``)."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    cfg = model.cfg
    refusal = pipeline_refusal(cfg)
    if refusal:
        raise ValueError(refusal)
    specs = [
        TiedLayerSpec(TIED, EncoderEmbedding, cfg, forward_fn=_embed, tied_weight_attr=["word.weight"]),
        *[LayerSpec(PipeEncoderBlock, cfg) for _ in range(cfg.n_layer)],
        LayerSpec(MLMTransform, cfg),
        TiedLayerSpec(TIED, TiedWord, cfg, forward_fn=_decode, tied_weight_attr=["word.weight"]),
        LayerSpec(DecoderBias, cfg.vocab_size),
    ]
    return build_pipeline(
        model,
        specs,
        block=EncoderBlock,
        checkpointable="PipeEncoderBlock",
        rename=lambda key: encoder_source_name(key, cfg.n_layer),
        std=normal_init_std,
        stages=stages,
        loss_fn=loss_fn,
        **layout,
    )
