"""XLNet (Yang et al. 2019): permutation language modelling on a Transformer-XL backbone.

- Two-stream self-attention. The content stream h_i sees x_{z<=t} (its own token included); the
  query stream g_i starts from one learned vector (``mask_emb``) and sees x_{z<t} and, through its
  relative positions, where z_t is -- never the token there. Both streams share every weight; the
  query stream is the one that predicts. The factorisation order is only an attention mask
  (``perm_mask[b, i, j] = 1``: i may not attend to j); the input order never changes.
- Transformer-XL attention: score(i, j) = (q_i + u) k_j + (q_i + v) W_r R_{i-j} + (q_i + s) e_{s_ij},
  with sinusoid relative positions R (the relative shift turns one row of distances into every
  query's), per-head biases u (``content_bias``, r_w_bias), v (``position_bias``, r_r_bias) and
  s (``segment_bias``, r_s_bias), and two learned segment vectors e (same / different segment).
- Segment-level recurrence: each layer's input of the previous segment (its first ``reuse_len``
  positions, the last ``mem_len`` kept) is prepended to the keys; memory is never differentiated.
- Post-LN blocks, GELU (erf), LayerNorm eps 1e-12, output layer tied to the word embedding with its
  own bias -- transformers' ``XLNetLMHeadModel`` exactly (glm_dist/families/xlnet/hf.py maps the weights).

Layouts are batch-first throughout: ``input_ids`` (B, T); memory a list of one (B, M, d_model)
tensor per layer. The loss is the objective's: cross-entropy of ``logits`` (B, P, V) against labels
(B, P) ignoring -100 (the ``plm`` objective's target_mapping is eye(T), so P = T and labels line up
with positions). Padding goes on the left (``<cls>`` is last); ``attention_mask`` keeps padded keys
out of every real position's attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from glm_dist.models.common import Flavor, flavor_config


@dataclass(frozen=True)
class XLNetConfig:
    n_layer: int
    n_head: int
    d_model: int
    d_ff: int
    vocab_size: int = 32000
    context_length: int = 512  # the segment length trained at; relative positions set no limit
    mem_len: int = 0  # hidden states kept per layer for the next segment (0: no memory is returned)
    reuse_len: int = 0  # only a segment's first reuse_len positions enter the memory (0: all of them)
    attn_type: str = "bi"  # bi: XLNet's bidirectional attention | uni: Transformer-XL's causal attention
    bi_data: bool = False  # batch = a forward half and a backward half (relative distances negated)
    clamp_len: int = 0  # > 0: relative distances clipped to +-clamp_len
    layer_norm_eps: float = 1e-12
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"n_head={self.n_head} must divide d_model={self.d_model}")
        if self.attn_type not in ("bi", "uni"):
            raise ValueError(f"attn_type={self.attn_type!r}: use 'bi' (XLNet) or 'uni' (Transformer-XL)")


# The paper gives no counts of its own: XLNet-Base/Large take BERT-Base/Large's hyperparameters, and
# "110M / 340M" are BERT's. XLNet adds the relative-position projection W_r (d^2 per layer), the u/v/s
# biases and segment vectors, a 32000-token vocabulary with an output bias, and drops BERT's position
# table and pooler: 116.75M / 360.30M, equal to transformers' XLNetLMHeadModel. Pretraining ran
# 512-token segments with a 384-state memory, of which each segment reuses its first 256 positions.
NAMED = "the paper reuses BERT's 110M / 340M names; the count is transformers' XLNetLMHeadModel"
PAPER_MEMORY = dict(context_length=512, mem_len=384, reuse_len=256)
FLAVORS: dict[str, Flavor] = {
    "xlnet-tiny": Flavor(XLNetConfig(n_layer=2, n_head=4, d_model=64, d_ff=256, vocab_size=8192, context_length=256)),
    "xlnet-base": Flavor(
        XLNetConfig(n_layer=12, n_head=12, d_model=768, d_ff=3072, **PAPER_MEMORY), 110e6, 0.07, NAMED
    ),  # 116.75M
    "xlnet-large": Flavor(
        XLNetConfig(n_layer=24, n_head=16, d_model=1024, d_ff=4096, **PAPER_MEMORY), 340e6, 0.07, NAMED
    ),  # 360.30M
}


xlnet_config = flavor_config(FLAVORS, "XLNet")


@dataclass
class AttentionContext:
    """What every layer's attention shares for one forward pass."""

    pos: torch.Tensor  # (1 or B, R, d_model) sinusoid encodings of the relative distances K .. -T + 1
    seg: torch.Tensor | None  # (B, T, K) True where query and key lie in different segments
    mask_h: torch.Tensor | None  # (B or 1, T, K) True = may not attend; the content stream sees itself
    mask_g: torch.Tensor | None  # the query stream's: the order as given (a target never sees its token)
    target_mapping: torch.Tensor | None  # (B, P, T): prediction p is made at position t


def rel_shift(x: torch.Tensor, klen: int) -> torch.Tensor:
    """Transformer-XL's shift: (B, H, T, R) scores against the R distances K, K-1, ... ->
    (B, H, T, K) with out[..., i, j] = x[..., i, j + T - i], i.e. the distance of query i to key j."""
    B, H, T, R = x.shape
    return x.reshape(B, H, R, T)[:, :, 1:].reshape(B, H, T, R - 1)[..., :klen]


def relative_positions(cfg: XLNetConfig, *, qlen: int, klen: int, batch: int, device: torch.device) -> torch.Tensor:
    """(1, R, d_model) sinusoid encodings of the distances from klen down to -qlen + 1 (bi) or 0
    (uni); with ``bi_data`` (B, R, d_model): the batch's second half sees every distance negated."""
    end = -qlen if cfg.attn_type == "bi" else -1
    fwd = torch.arange(klen, end, -1, device=device).float()  # (R,)
    seqs = [fwd, -fwd] if cfg.bi_data else [fwd]
    if cfg.clamp_len > 0:
        seqs = [s.clamp(-cfg.clamp_len, cfg.clamp_len) for s in seqs]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, cfg.d_model, 2, device=device).float() / cfg.d_model)
    embs = [torch.cat([torch.sin(s[:, None] * inv_freq), torch.cos(s[:, None] * inv_freq)], -1) for s in seqs]
    if not cfg.bi_data:
        return embs[0][None]
    if batch % 2:
        raise ValueError(f"bi_data pairs a forward and a backward half of the batch; batch size {batch} is odd")
    return torch.cat([e[None].expand(batch // 2, -1, -1) for e in embs])


def attention_masks(
    cfg: XLNetConfig,
    *,
    qlen: int,
    mlen: int,
    pad: torch.Tensor | None,
    perm_mask: torch.Tensor | None,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(mask_h, mask_g), each (B or 1, T, M + T) boolean, True = may not attend; None when nothing
    is masked. ``pad`` (B, T): padded keys; ``perm_mask`` (B, T, T): the factorisation order.
    Memory columns stay visible (transformers' convention)."""
    blocked = None
    if cfg.attn_type == "uni":  # key positions after the query's own (M + i) are in the future
        blocked = torch.ones(qlen, mlen + qlen, dtype=torch.bool, device=device).triu(mlen + 1)[None]
    data = None
    if pad is not None:
        data = pad[:, None, :]  # (B, 1, T)
    if perm_mask is not None:
        perm = perm_mask > 0
        data = perm if data is None else data | perm
    if data is not None:
        data = F.pad(data, (mlen, 0))  # (B, 1 or T, M + T): memory is always visible
        blocked = data if blocked is None else blocked | data
    if blocked is None:
        return None, None
    # (T, K): query i's own key, which the content stream always sees
    own = torch.arange(mlen + qlen, device=device)[None, :] == torch.arange(qlen, device=device)[:, None] + mlen
    return blocked & ~own, blocked


class RelativeAttention(nn.Module):
    """Transformer-XL multi-head attention with segment terms, shared by both streams."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.n_head, self.d_head = cfg.n_head, cfg.d_model // cfg.n_head
        self.q, self.k, self.v, self.r = (nn.Linear(cfg.d_model, cfg.d_model, bias=False) for _ in range(4))
        self.o = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.content_bias = nn.Parameter(torch.zeros(cfg.n_head, self.d_head))  # u
        self.position_bias = nn.Parameter(torch.zeros(cfg.n_head, self.d_head))  # v
        self.segment_bias = nn.Parameter(torch.zeros(cfg.n_head, self.d_head))  # s
        self.segment_embed = nn.Parameter(torch.zeros(2, cfg.n_head, self.d_head))  # same / different segment
        self.drop = nn.Dropout(cfg.dropout)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:2], self.n_head, self.d_head).transpose(1, 2)  # (B, L, d) -> (B, H, L, d_head)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_r: torch.Tensor,
        seg: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """q (B, H, T, dh); k, v (B, H, K, dh); k_r (1 or B, H, R, dh) -> (B, H, T, dh)."""
        ac = (q + self.content_bias[:, None]) @ k.transpose(-1, -2)  # (B, H, T, K) content
        bd = rel_shift((q + self.position_bias[:, None]) @ k_r.transpose(-1, -2), k.shape[2])  # position
        scores = ac + bd
        if seg is not None:  # (B, H, T, 2): the query against the same- and the different-segment vector
            ef = torch.einsum("bhtd,shd->bhts", q + self.segment_bias[:, None], self.segment_embed)
            scores = scores + torch.where(seg[:, None], ef[..., 1:], ef[..., :1])
        scores = scores / math.sqrt(self.d_head)
        if mask is not None:  # a finite fill: a row with nothing visible averages instead of giving NaN
            scores = scores.masked_fill(mask[:, None], torch.finfo(scores.dtype).min)
        return self.drop(scores.float().softmax(-1).to(v.dtype)) @ v  # softmax in fp32 under bf16 too

    def forward(
        self, h: torch.Tensor, g: torch.Tensor | None, mem: torch.Tensor | None, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h (B, T, d), g (B, P, d), mem (B, M, d) -> attention outputs of both streams (after ``o``)."""
        merge = lambda y: self.o(y.transpose(1, 2).flatten(2))  # noqa: E731  (B, H, L, dh) -> (B, L, d)
        keys = h if mem is None else torch.cat([mem.to(h.dtype), h], dim=1)  # (B, K, d)
        k, v, k_r = self._split(self.k(keys)), self._split(self.v(keys)), self._split(self.r(ctx.pos.to(h.dtype)))
        out_h = merge(self._attend(self._split(self.q(h)), k, v, k_r, ctx.seg, ctx.mask_h))
        if g is None:
            return out_h, None
        tm = ctx.target_mapping.to(g.dtype)
        q_g = torch.einsum("bhpd,bpt->bhtd", self._split(self.q(g)), tm)  # each prediction at its position
        y = self._attend(q_g, k, v, k_r, ctx.seg, ctx.mask_g)
        return out_h, merge(torch.einsum("bhtd,bpt->bhpd", y, tm))


class FeedForward(nn.Module):
    """Post-LN: LN(x + W2 GELU(W1 x))."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)
        self.ln = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x + self.drop(self.proj(self.drop(F.gelu(self.fc(x))))))


class XLNetBlock(nn.Module):
    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.attn = RelativeAttention(cfg)
        self.ln_attn = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, h: torch.Tensor, g: torch.Tensor | None, mem: torch.Tensor | None, ctx: AttentionContext
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a_h, a_g = self.attn(h, g, mem, ctx)
        h = self.ffn(self.ln_attn(h + self.drop(a_h)))
        return h, None if g is None else self.ffn(self.ln_attn(g + self.drop(a_g)))


class XLNetEmbedding(nn.Module):
    """Word embeddings start the content stream; one learned vector starts every query-stream row."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mask_emb = nn.Parameter(torch.zeros(cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)

    def forward(
        self, input_ids: torch.Tensor, target_mapping: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.drop(self.word(input_ids))  # (B, T, d)
        if target_mapping is None:
            return h, None
        return h, self.drop(self.mask_emb.expand(*target_mapping.shape[:2], -1).to(h.dtype))  # (B, P, d)


class XLNetHead(nn.Module):
    """Output layer: weight tied to the word embedding, a bias of its own."""

    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.drop = nn.Dropout(cfg.dropout)
        self.lm = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(self.drop(x))  # (B, L, V)


class XLNet(nn.Module):
    def __init__(self, cfg: XLNetConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = XLNetEmbedding(cfg)
        self.blocks = nn.ModuleList(XLNetBlock(cfg) for _ in range(cfg.n_layer))
        self.head = XLNetHead(cfg)
        self.head.lm.weight = self.embed.word.weight  # tied input/output embedding
        self.activation_checkpointing = False
        self._init()

    def _init(self) -> None:
        """transformers' init: N(0, 0.02) for every matrix, bias vector and segment vector; zero
        Linear biases; unit LayerNorms."""
        for name, p in self.named_parameters():
            if isinstance(self.get_submodule(name.rsplit(".", 1)[0]), nn.LayerNorm) and name.endswith("weight"):
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def layers(self) -> list[nn.Module]:
        """Embedding, blocks, head: the parameter units a plan counts. Not a chain of single-tensor
        layers (a block takes both streams, its memory and the shared attention context)."""
        return [self.embed, *self.blocks, self.head]

    def _context(
        self,
        input_ids: torch.Tensor,
        mlen: int,
        perm_mask: torch.Tensor | None,
        target_mapping: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        input_mask: torch.Tensor | None,
    ) -> AttentionContext:
        B, T = input_ids.shape
        if attention_mask is not None and input_mask is not None:
            raise ValueError("pass attention_mask (1 = token) or input_mask (1 = padding), not both")
        pad = None  # (B, T) True at padding
        if attention_mask is not None:
            pad = attention_mask == 0
        elif input_mask is not None:
            pad = input_mask > 0
        mask_h, mask_g = attention_masks(
            self.cfg, qlen=T, mlen=mlen, pad=pad, perm_mask=perm_mask, device=input_ids.device
        )
        seg = None
        if token_type_ids is not None:  # memory counts as segment 0 (transformers' convention)
            keys = F.pad(token_type_ids, (mlen, 0))
            seg = token_type_ids[:, :, None] != keys[:, None, :]  # (B, T, K)
        pos = relative_positions(self.cfg, qlen=T, klen=mlen + T, batch=B, device=input_ids.device)
        return AttentionContext(self.embed.drop(pos), seg, mask_h, mask_g, target_mapping)

    def _cache(self, h: torch.Tensor, mem: torch.Tensor | None) -> torch.Tensor:
        """The next segment's memory for one layer: (B, <= mem_len, d), cut from the graph."""
        cur = h[:, : self.cfg.reuse_len] if self.cfg.reuse_len > 0 else h
        full = cur if mem is None else torch.cat([mem.to(cur.dtype), cur], dim=1)
        return full[:, -self.cfg.mem_len :].detach()

    def streams(
        self,
        input_ids: torch.Tensor,
        *,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        input_mask: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor] | None]:
        """-> (h (B, T, d) content stream, g (B, P, d) query stream or None, new memory or None)."""
        mlen = mems[0].shape[1] if mems else 0
        ctx = self._context(input_ids, mlen, perm_mask, target_mapping, token_type_ids, attention_mask, input_mask)
        h, g = self.embed(input_ids, target_mapping)
        new_mems = []
        for i, block in enumerate(self.blocks):
            mem = mems[i] if mems else None
            if self.cfg.mem_len > 0:
                new_mems.append(self._cache(h, mem))  # each layer's input, as Transformer-XL caches it
            if self.activation_checkpointing and self.training:
                h, g = checkpoint(block, h, g, mem, ctx, use_reentrant=False)
            else:
                h, g = block(h, g, mem, ctx)
        return h, g, new_mems or None

    def encode(self, input_ids: torch.Tensor, **inputs: torch.Tensor | list[torch.Tensor] | None) -> torch.Tensor:
        """(B, T, d) final content-stream states, for heads that read a position (XLNet classifies from
        the last one, ``<cls>``). ``inputs``: as ``forward``, without target_mapping."""
        return self.streams(input_ids, **inputs)[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        perm_mask: torch.Tensor | None = None,
        target_mapping: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        input_mask: torch.Tensor | None = None,
        mems: list[torch.Tensor] | None = None,
    ) -> dict:
        """``logits``: (B, P, V) from the query stream when ``target_mapping`` (B, P, T) is given, else
        (B, T, V) from the content stream; ``mems``: one (B, <= mem_len, d) tensor per layer (None
        when ``mem_len`` is 0); ``hidden_states``: (B, T, d) content stream.
        ``perm_mask`` (B, T, T): 1 = i may not attend to j; ``attention_mask`` (B, T): 1 = token,
        or ``input_mask``: 1 = padding; ``token_type_ids`` (B, T): any ids, compared for equality;
        ``mems``: the previous call's."""
        h, g, new_mems = self.streams(
            input_ids,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            input_mask=input_mask,
            mems=mems,
        )
        return {"logits": self.head(h if g is None else g), "mems": new_mems, "hidden_states": h}

    def num_flops_per_token(self, seq_len: int, *, mem_len: int = 0) -> float:
        """Training FLOPs per token (3x forward) of a PLM step predicting at every position (the ``plm``
        objective's target_mapping = eye(T)). Both streams run q, o and the FFN; keys and values are
        computed once; each stream scores K = T + mem_len keys and R = K + T relative distances
        (K + 1 for ``uni``) and mixes K values; the output layer runs on the query stream. Left out:
        the position projection (once per batch) and target_mapping's gather-as-matmul."""
        d, f, T = self.cfg.d_model, self.cfg.d_ff, seq_len
        K = T + mem_len
        R = K + T if self.cfg.attn_type == "bi" else K + 1
        weights = 2 * (4 * d * d + 2 * d * f) + 2 * (2 * d * d + 2 * d * f)  # content + query stream
        attention = 2 * (2 * K * d + 2 * R * d + 2 * K * d)
        return 3 * (self.cfg.n_layer * (weights + attention) + 2 * d * self.cfg.vocab_size)
