"""The bidirectional encoders: BERT, RoBERTa, ALBERT and ELECTRA.

One post-LN encoder block serves all four (the architecture really is the same); the families
differ in their embeddings and heads, which are data here:

- BERT: token + segment + learned position embeddings, LayerNorm; [CLS] pooler (tanh); MLM head
  (dense, GELU, LayerNorm, decoder tied to the input embedding, bias); NSP head.
- RoBERTa: BERT with RoBERTa's position convention (positions start at pad id + 1 and padding
  keeps the pad position), one segment type, no NSP.
- ALBERT: factorised embedding (V x E, then E x H), cross-layer parameter sharing (all / attention
  / ffn / none), GELU-tanh, SOP head on the pooler.
- ELECTRA: embedding size E projected to H when they differ; the discriminator's head predicts
  "replaced" per token; the generator is a narrower model with an MLM head of width E.

Every model is an ordered list of layers (embedding, blocks, head) for pipeline staging.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from glm_dist.models.common import Flavor, ShardPlan, VocabPlan, flavor_config


@dataclass(frozen=True)
class EncoderConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int = 30522
    context_length: int = 512
    type_vocab_size: int = 2
    embedding_size: int | None = None  # ALBERT / ELECTRA: E (None: d_model)
    position_offset: int = 0  # RoBERTa: pad id + 1 (positions 0..pad are never used)
    pad_id: int = 0
    share: str = "none"  # ALBERT cross-layer sharing: none | all | attention | ffn
    activation: str = "gelu"  # gelu (erf) | gelu_new (tanh)
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0
    # mlm_nsp (BERT) | mlm (RoBERTa) | mlm_sop (ALBERT) | rtd (ELECTRA disc.) | gen (ELECTRA gen.)
    head: str = "mlm_nsp"
    generator_fraction: float = 0.0  # ELECTRA: generator width / discriminator width (1/4 small, 1/3 base, large)

    @property
    def emb(self) -> int:
        return self.embedding_size or self.d_model

    @property
    def ffn_width(self) -> int:
        """The FFN's inner width (what tensor parallelism splits), as every transformer family names it."""
        return self.d_ff


def _act(name: str):
    return (lambda x: F.gelu(x, approximate="tanh")) if name == "gelu_new" else F.gelu


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention with a padding mask, on ``scaled_dot_product_attention``."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.query, self.key, self.value = (nn.Linear(cfg.d_model, cfg.d_model) for _ in range(3))
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.drop = cfg.dropout
        # the attention-probability dropout's random numbers: a tensor rank's own stream when heads are
        # split (glm_dist/parallel/rng.py)
        self.probs_rng: Callable = contextlib.nullcontext

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # (B, T, width): projections may be narrower than d_model (this rank's heads under tensor
        # parallelism) and longer than x (its positions gathered under sequence parallelism)
        q, k, v = (p(x) for p in (self.query, self.key, self.value))
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        p = self.drop if self.training else 0.0
        with self.probs_rng() if p else contextlib.nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.dense(y.transpose(1, 2).reshape(B, T, -1))


class EncoderBlock(nn.Module):
    """Post-LN: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, cfg: EncoderConfig, attention: SelfAttention | None = None, ffn: nn.ModuleDict | None = None):
        super().__init__()
        self.attn = attention or SelfAttention(cfg)
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = ffn or nn.ModuleDict(
            {"fc": nn.Linear(cfg.d_model, cfg.d_ff), "proj": nn.Linear(cfg.d_ff, cfg.d_model)}
        )
        self.ln_ffn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.act, self.drop = _act(cfg.activation), nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.ln_attn(x + self.drop(self.attn(x, mask)))
        return self.ln_ffn(x + self.drop(self.ffn["proj"](self.act(self.ffn["fc"](x)))))


# tensor parallelism (parallel/tensor.py): heads and FFN width split; ALBERT's shared block is split once
TENSOR_PLANS = {
    SelfAttention: ShardPlan(column=("query", "key", "value"), row=("dense",), heads="n_head"),
    EncoderBlock: ShardPlan(column=("ffn.fc",), row=("ffn.proj",)),
}


class EncoderEmbedding(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.word = nn.Embedding(cfg.vocab_size, cfg.emb, padding_idx=cfg.pad_id if cfg.position_offset else None)
        self.position = nn.Embedding(cfg.context_length + cfg.position_offset, cfg.emb)
        self.token_type = nn.Embedding(cfg.type_vocab_size, cfg.emb)
        self.ln = nn.LayerNorm(cfg.emb, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)
        self.project = nn.Linear(cfg.emb, cfg.d_model) if cfg.emb != cfg.d_model else None

    def positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.cfg.position_offset:
            return torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        keep = (input_ids != self.cfg.pad_id).long()  # RoBERTa: pad positions stay at the pad index
        return torch.cumsum(keep, dim=1) * keep + self.cfg.pad_id

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        x = self.word(input_ids) + self.position(self.positions(input_ids)) + self.token_type(types)
        x = self.drop(self.ln(x))
        return self.project(x) if self.project is not None else x


class MLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> decoder (tied to the word embedding) + bias."""

    def __init__(self, cfg: EncoderConfig, width: int):
        super().__init__()
        self.dense = nn.Linear(cfg.d_model, width)
        self.ln = nn.LayerNorm(width, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(width, cfg.vocab_size)
        self.act = _act(cfg.activation)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.ln(self.act(self.dense(h))))


class EncoderHead(nn.Module):
    """The family's pretraining heads on the final hidden states -> dict of logits."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.kind = cfg.head
        if cfg.head in ("mlm_nsp", "mlm", "mlm_sop"):
            self.mlm = MLMHead(cfg, cfg.emb if cfg.head == "mlm_sop" else cfg.d_model)
        if cfg.head in ("mlm_nsp", "mlm_sop"):
            self.pooler = nn.Linear(cfg.d_model, cfg.d_model)
            self.sentence = nn.Linear(cfg.d_model, 2)
        if cfg.head == "gen":
            self.mlm = MLMHead(cfg, cfg.emb)
        if cfg.head == "rtd":
            self.dense = nn.Linear(cfg.d_model, cfg.d_model)
            self.predict = nn.Linear(cfg.d_model, 1)
            self.act = _act(cfg.activation)

    def forward(self, h: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.kind == "rtd":
            return {"logits": self.predict(self.act(self.dense(h))).squeeze(-1)}  # (B, T): replaced?
        out = {"logits": self.mlm(h)}  # (B, T, V)
        if hasattr(self, "sentence"):
            out["sentence_logits"] = self.sentence(torch.tanh(self.pooler(h[:, 0])))  # (B, 2) from [CLS]
        return out


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = EncoderEmbedding(cfg)
        self.blocks = nn.ModuleList(self._blocks(cfg))
        self.head = EncoderHead(cfg)
        if hasattr(self.head, "mlm"):
            self.head.mlm.decoder.weight = self.embed.word.weight  # tied input/output embedding
        self.activation_checkpointing = False
        self.apply(self._init)

    @staticmethod
    def _blocks(cfg: EncoderConfig) -> list[EncoderBlock]:
        """ALBERT's sharing: one attention and/or FFN module reused by every block."""
        if cfg.share == "none":
            return [EncoderBlock(cfg) for _ in range(cfg.n_layer)]
        first = EncoderBlock(cfg)
        if cfg.share == "all":
            return [first] * cfg.n_layer
        return [first] + [
            EncoderBlock(
                cfg,
                attention=first.attn if cfg.share == "attention" else None,
                ffn=first.ffn if cfg.share == "ffn" else None,
            )
            for _ in range(cfg.n_layer - 1)
        ]

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def layers(self) -> list[nn.Module]:
        return [self.embed, *self.blocks, self.head]

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        mask = None
        if attention_mask is not None:  # (B, T) 1 = token -> (B, 1, 1, T) boolean for SDPA
            mask = attention_mask.bool()[:, None, None, :]
        x = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, mask)
        return {**self.head(x), "hidden_states": x}

    def num_flops_per_token(self, seq_len: int) -> float:
        n = sum(p.numel() for p in self.parameters()) - self.embed.position.weight.numel()
        return 6 * n + 12 * self.cfg.n_layer * self.cfg.d_model * seq_len


def _bert(n_layer, d, heads, **kw) -> EncoderConfig:
    return EncoderConfig(n_layer=n_layer, n_head=heads, d_model=d, d_ff=4 * d, **kw)


ROBERTA = dict(vocab_size=50265, type_vocab_size=1, position_offset=2, pad_id=1, layer_norm_eps=1e-5, head="mlm")
ALBERT = dict(vocab_size=30000, embedding_size=128, share="all", activation="gelu_new", head="mlm_sop")
ELECTRA = dict(head="rtd", generator_fraction=1 / 3)
# Published counts (docs/reference.md#model-sizes). BERT's and ELECTRA's figures are rounded (BERT-base is 109.5M
# plus its heads); the rows say which count they are.
FLAVORS: dict[str, Flavor] = {
    "bert-tiny": Flavor(_bert(2, 128, 2, vocab_size=8192, context_length=256)),
    "bert-base": Flavor(_bert(12, 768, 12), 110e6, 0.02, "encoder + pooler; the NSP/MLM heads add 0.6M"),
    "bert-large": Flavor(_bert(24, 1024, 16), 340e6, 0.02),
    "roberta-tiny": Flavor(_bert(2, 128, 2, **{**ROBERTA, "vocab_size": 8192}, context_length=256)),
    "roberta-base": Flavor(_bert(12, 768, 12, **ROBERTA), 125e6),
    "roberta-large": Flavor(_bert(24, 1024, 16, **ROBERTA), 355e6),
    "albert-tiny": Flavor(_bert(4, 128, 2, **{**ALBERT, "vocab_size": 8192, "embedding_size": 64}, context_length=256)),
    "albert-base": Flavor(_bert(12, 768, 12, **ALBERT), 12e6, 0.02),
    "albert-large": Flavor(_bert(24, 1024, 16, **ALBERT), 18e6, 0.02),
    "albert-xlarge": Flavor(_bert(24, 2048, 32, **ALBERT), 60e6, 0.02),
    # The paper prints 235M; the released xxlarge (transformers' AlbertForPreTraining) has 223M,
    # which this count equals exactly.
    "albert-xxlarge": Flavor(_bert(12, 4096, 64, **ALBERT), 235e6, 0.06, "paper 235M; released 223M"),
    "electra-tiny": Flavor(
        _bert(2, 128, 2, **{**ELECTRA, "generator_fraction": 0.5}, vocab_size=8192, context_length=256)
    ),
    # 13.5M discriminator; the paper's 14M also counts the generator (embeddings shared).
    "electra-small": Flavor(
        _bert(12, 256, 4, **{**ELECTRA, "generator_fraction": 0.25}, embedding_size=128, context_length=512),
        14e6,
        0.04,
        "discriminator only; +0.6M generator",
    ),
    "electra-base": Flavor(_bert(12, 768, 12, **ELECTRA), 110e6, 0.02),
    "electra-large": Flavor(_bert(24, 1024, 16, **ELECTRA), 335e6, 0.02),
}


def pipeline_refusal(cfg: EncoderConfig) -> str | None:
    """Why an encoder cannot be cut into pipeline stages (None: it can): the stage layout is
    embedding, blocks, MLM transform, tied decoder -- unshared, unfactorised layers and an MLM head."""
    if cfg.share != "none" or cfg.head != "mlm" or cfg.emb != cfg.d_model:
        return (
            "the encoder pipeline runs BERT/RoBERTa-style encoders with an MLM head and unshared, "
            "unfactorised layers (not ALBERT's sharing or a factorised embedding, nor NSP/SOP heads)"
        )
    return None


encoder_config = flavor_config(FLAVORS, "encoder")


def generator_config(disc: EncoderConfig, *, fraction: float | None = None) -> EncoderConfig:
    """ELECTRA's generator: the discriminator's depth and embedding, ``fraction`` of its width
    (1/4 small, 1/3 base/large), heads scaled to keep 64-dim heads."""
    d = int(disc.d_model * (fraction or disc.generator_fraction))
    return replace(
        disc, d_model=d, d_ff=4 * d, n_head=max(1, d // 64), embedding_size=disc.emb, head="gen", generator_fraction=0.0
    )


class ElectraPair(nn.Module):
    """ELECTRA's generator and discriminator, trained jointly, sharing token, position and segment
    embeddings. ``forward`` runs the generator on the masked input, samples its predictions at the
    masked positions (``labels != -100``), and runs the discriminator on the result."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.discriminator = Encoder(cfg)
        self.generator = Encoder(generator_config(cfg))
        for name in ("word", "position", "token_type", "ln"):
            setattr(self.generator.embed, name, getattr(self.discriminator.embed, name))
        self.generator.head.mlm.decoder.weight = self.discriminator.embed.word.weight
        self.activation_checkpointing = False

    def layers(self) -> list[nn.Module]:
        return [self.generator, self.discriminator]

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_positions: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """``masked_positions`` (B, K), the loader's list of the masked positions (padded with
        position 0 where ``labels`` there is -100): only those rows of the logits are sampled, with no
        boolean indexing (no device-to-host sync); without it the positions come from ``labels``."""
        for m in (self.generator, self.discriminator):
            m.activation_checkpointing = self.activation_checkpointing
        gen = self.generator(input_ids, token_type_ids, attention_mask)["logits"]  # (B, T, V)
        chosen = labels != -100
        original = torch.where(chosen, labels, input_ids)
        replaced = original.clone()
        with torch.no_grad():  # sampling is not differentiated (the paper's "no adversarial" choice)
            if masked_positions is None:
                replaced[chosen] = torch.multinomial(torch.softmax(gen[chosen].float(), -1), 1).squeeze(-1)
            else:
                rows = torch.arange(gen.shape[0], device=gen.device)[:, None]
                picked = gen[rows, masked_positions].float()  # (B, K, V)
                sampled = torch.multinomial(torch.softmax(picked.flatten(0, 1), -1), 1).view(masked_positions.shape)
                listed = chosen.gather(1, masked_positions)  # False on the padding entries
                # padding entries write into a spare column T, so they never race a real position
                target = torch.where(listed, masked_positions, replaced.shape[1])
                spare = torch.cat([replaced, replaced[:, :1]], 1).scatter_(1, target, sampled)
                replaced = spare[:, :-1]
        disc = self.discriminator(replaced, token_type_ids, attention_mask)["logits"]  # (B, T)
        return {"gen_logits": gen, "disc_logits": disc, "disc_targets": (replaced != original).float()}

    def num_flops_per_token(self, seq_len: int) -> float:
        return self.generator.num_flops_per_token(seq_len) + self.discriminator.num_flops_per_token(seq_len)


# tensor parallelism by vocabulary: the word embedding's rows and the tied MLM decoder's columns
VOCAB_PLANS = {EncoderEmbedding: VocabPlan(embedding="word"), MLMHead: VocabPlan(outputs=("decoder",))}
