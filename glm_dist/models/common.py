"""Building blocks shared by the model families. No distribution code here (docs/architecture.md, decision 2)."""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention on ``scaled_dot_product_attention``.

    ``window``: when set, each query sees only the previous ``window`` positions (itself
    included) -- the locally banded pattern of GPT-3's sparse layers. A whole sequence longer than
    the window is attended in blocks (``_banded``: scores and mask grow as T x 2W, not T x T);
    incremental decoding uses the (T, past + T) band mask.
    """

    def __init__(self, d_model: int, n_head: int, *, dropout: float = 0.0, window: int | None = None):
        super().__init__()
        assert d_model % n_head == 0, f"n_head={n_head} must divide d_model={d_model}"
        self.n_head, self.window, self.dropout = n_head, window, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_drop = nn.Dropout(dropout)
        # where the attention-probability dropout draws its random numbers: tensor parallelism makes it
        # the rank's own stream, since each rank holds other heads (glm_dist/parallel/rng.py)
        self.probs_rng: Callable = contextlib.nullcontext
        self._band_cache: dict[tuple[int, torch.device], torch.Tensor] = {}

    def forward(self, x: torch.Tensor, cache: dict | None = None) -> torch.Tensor:
        """``cache``: a dict this layer keeps its keys/values in, for incremental decoding."""
        # each (B, T, width): width = d_model, or this rank's heads; T = the whole sequence, also when
        # x holds only this rank's positions (sequence parallelism gathers them in the projection)
        q, k, v = self.qkv(x).chunk(3, dim=2)
        B, T, width = q.shape
        # (B, T, width) -> (B, n_head, T, head_dim)
        q, k, v = (t.view(B, T, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        past = 0
        if cache is not None:
            if "k" in cache:
                past = cache["k"].shape[2]
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        p = self.dropout if self.training else 0.0
        with self.probs_rng() if p else contextlib.nullcontext():
            y = self._attend(q, k, v, p, past)
        y = y.transpose(1, 2).contiguous().view(B, T, width)
        return self.resid_drop(self.proj(y))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float, past: int) -> torch.Tensor:
        T = q.shape[2]
        causal = self.window is None or self.window >= past + T  # the window cuts nothing: plain causal
        if causal and past == 0:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if causal and T == 1:  # one new query sees every cached key: no mask, so flash kernels apply
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        if past == 0:  # a sparse layer over a sequence longer than its window
            return self._banded(q, k, v, p)
        # is_causal aligns the mask top-left, wrong once keys run ahead of queries: a band mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._band(T, q.device, past=past), dropout_p=p)

    def _banded(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        """Sliding-window attention in blocks of W = ``window`` queries, each block attending to
        itself and the previous block under ``_block_band``: (B, H, T, D) -> (B, H, T, D) with
        T x 2W scores. The sequence is padded to whole blocks: padded queries are dropped, padded
        keys lie after every real query (never causal)."""
        B, H, T, D = q.shape
        W, n = self.window, -(-T // self.window)
        # (B, H, T, D) -> (B*H, n, W, D): SDPA's "heads" axis runs over the blocks, so the mask is shared
        q, k, v = (F.pad(t, (0, 0, 0, n * W - T)).reshape(B * H, n, W, D) for t in (q, k, v))
        # keys and values of the previous block (zeros before the first), then the block's own: (B*H, n, 2W, D)
        k, v = (torch.cat([F.pad(t, (0, 0, 0, 0, 1, -1)), t], dim=2) for t in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._block_band(n, q.device), dropout_p=p)
        return y.view(B, H, n * W, D)[:, :, :T]

    def _block_band(self, n: int, device: torch.device) -> torch.Tensor:
        """(1, n, W, 2W) boolean: query a of a block sees key c of [previous block; block] when
        0 <= (W + a) - c < W; the first block has no previous one. 4-D, as SDPA's fused kernels
        want it (a 3-D mask sends the CPU to the math path, which keeps the scores). Made per call
        (T x 2W bytes, a few small kernels), not cached: a compiled block then guards on no cache."""
        W = self.window
        a = torch.arange(W, device=device)[:, None]
        c = torch.arange(2 * W, device=device)[None, :]
        allowed = ((c > a) & (c <= a + W)).expand(n, W, 2 * W).clone()
        allowed[0, :, :W] = False
        return allowed[None]

    def _band(self, T: int, device: torch.device, past: int = 0) -> torch.Tensor:
        """(T, past + T) boolean: causal, and within the window for sparse layers."""
        key = (T, past, device)
        if key not in self._band_cache:
            q = torch.arange(past, past + T, device=device)
            offset = q[:, None] - torch.arange(past + T, device=device)[None, :]  # query minus key position
            allowed = offset >= 0
            if self.window is not None:
                allowed &= offset < self.window
            self._band_cache[key] = allowed
        return self._band_cache[key]


class OutputLinear(nn.Linear):
    """The output projection to the vocabulary. ``project(x, weight, bias)``, when given, replaces
    the matmul: a loss that never materialises the (tokens x vocab) logits
    (``glm_dist/ops/cross_entropy.py``) gets the matrix inside this module's call, where ZeRO-3 has
    gathered it, and its result is returned instead of the logits."""

    def forward(self, x: torch.Tensor, project: Callable | None = None):
        return super().forward(x) if project is None else project(x, self.weight, self.bias)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear -> GELU (tanh approximation, as GPT-2) -> Linear."""

    def __init__(self, d_model: int, d_ff: int, *, dropout: float = 0.0):
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


def init_gpt_weights(module: nn.Module, *, n_layer: int, std: float = 0.02, scale_residuals: bool = True) -> None:
    """GPT-2 init: N(0, 0.02) weights, zero biases, unit norms; residual projections (the
    ``proj`` of attention and MLP) get std / sqrt(2 * n_layer) so the residual stream's variance
    does not grow with depth (``scale_residuals=False``: GPT-1's, which had not that rule)."""
    for name, p in module.named_parameters():
        if scale_residuals and name.endswith("proj.weight"):
            nn.init.normal_(p, mean=0.0, std=std / math.sqrt(2 * n_layer))
        elif name.endswith(".bias"):
            nn.init.zeros_(p)
        elif "ln" in name.split(".")[-2]:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, mean=0.0, std=std)


def normal_init_std(cfg: Any) -> Callable[[str], float]:
    """train.init=local's rule for BERT and BART (parallel/init.py): every weight N(0, 0.02)."""
    return lambda name: 0.02


def count_parameters(model: nn.Module) -> int:
    """Unique parameters (tied weights counted once), a padded vocabulary's padding rows not counted
    (``pad_vocab_rows``): the model's published size. Works on the meta device."""
    return sum(_real_numel(p) for p in model.parameters())


def _real_numel(p: torch.Tensor) -> int:
    rows = getattr(p, "vocab_rows", None)  # a vocabulary shard of tensor parallelism keeps the mark, not the rows
    return p.numel() if rows is None or p.shape[0] <= rows else p.numel() // p.shape[0] * rows


def padded_size(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple`` (Megatron-LM's make-vocab-size-divisible-by)."""
    return -(-vocab_size // multiple) * multiple


def pad_vocab_rows(module: nn.Module, vocab_size: int) -> None:
    """Mark ``module``'s parameters whose rows run over a vocabulary padded beyond ``vocab_size`` (an
    embedding's weight, an output projection's weight and bias): ``vocab_rows`` on each tells
    ``count_parameters`` which rows are real, and a state dict holding only those rows (a checkpoint
    written before the padding, a transformers model) loads with zero padding rows."""
    padded = [name for name, p in module.named_parameters(recurse=False) if p.shape[0] > vocab_size]
    for name in padded:
        getattr(module, name).vocab_rows = vocab_size
    if padded:
        module.register_load_state_dict_pre_hook(functools.partial(_pad_on_load, names=padded, rows=vocab_size))


def _pad_on_load(module: nn.Module, state_dict: dict, prefix: str, *args, names: list[str], rows: int) -> None:
    for name in names:
        value, padded = state_dict.get(prefix + name), getattr(module, name).shape[0]
        if value is not None and value.shape[0] == rows < padded:
            state_dict[prefix + name] = torch.cat([value, value.new_zeros(padded - rows, *value.shape[1:])])


@dataclass(frozen=True)
class ShardPlan:
    """How tensor parallelism (parallel/tensor.py) splits one module class, by attribute path:
    column-parallel linears (``fused`` ones hold several equal parts side by side, e.g. GPT's
    [q; k; v]: path -> number of parts), row-parallel linears, the attribute that counts heads
    (divided by the tensor-parallel size), embedding tables with one column per head (T5's
    relative-position bias: split by columns with the heads), and the paths a module may lack
    (a T5 FFN has ``wi`` or ``wi_0``/``wi_1``, a non-first T5 layer no bias table)."""

    column: tuple[str, ...] = ()
    row: tuple[str, ...] = ()
    fused: dict | None = None
    heads: str | None = None
    head_tables: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


@dataclass(frozen=True)
class VocabPlan:
    """How a module class splits by vocabulary under tensor parallelism (parallel/tensor.py): attribute
    paths of its token embedding, the output projections tied to it (their bias sliced with it), and
    vocabulary-sized biases of their own (a pipeline's decoder bias)."""

    embedding: str | None = None
    outputs: tuple[str, ...] = ()
    biases: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flavor:
    """A named size: its config, the published parameter count as docs/reference.md#model-sizes lists it (0 for
    test flavors), the relative tolerance of the count check, and why the tolerance is what it is."""

    cfg: Any
    params: float = 0
    tol: float = 0.01
    note: str = ""


def flavor_config(flavors: dict[str, Flavor], label: str) -> Callable[..., Any]:
    """A family's ``(flavor, **overrides) -> config``: the named flavor with fields replaced by the
    non-None ``overrides`` (litgpt's ``from_name``); ``label`` names the family in the error."""

    def config(flavor: str, **overrides) -> Any:
        if flavor not in flavors:
            raise KeyError(f"unknown {label} flavor {flavor!r}; known: {', '.join(flavors)}")
        return replace(flavors[flavor].cfg, **{k: v for k, v in overrides.items() if v is not None})

    return config


# tensor parallelism of the layers above (GPT's blocks)
GPT_TENSOR_PLANS = {
    CausalSelfAttention: ShardPlan(column=("qkv",), row=("proj",), fused={"qkv": 3}, heads="n_head"),
    MLP: ShardPlan(column=("fc",), row=("proj",)),
}
