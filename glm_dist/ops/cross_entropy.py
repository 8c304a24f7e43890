"""Cross entropy over a large vocabulary without the whole (tokens x vocab) fp32 logits.

Two entry points, both chunked over tokens (``chunk_tokens`` rows of fp32 logits alive at a time):

- ``linear_cross_entropy(hidden, weight, targets)``: the output projection and the loss fused.
  Each chunk's logits are computed, reduced to its rows' NLL and, when gradients are wanted, turned
  at once into that chunk's gradients (softmax - one-hot, then the two matmuls of the projection's
  backward), so the logits never exist whole and are never recomputed: backward only scales the
  gradients kept from the forward by the incoming scalar (torch's chunked ``linear_cross_entropy``
  and Liger's kernel do the same). That is why only the summed NLL is differentiable.
- ``cross_entropy(logits, targets)``: for logits a model already made (a pipeline's last stage,
  MLM's gathered rows, the encoder-decoders): the fp32 copy, its log-softmax and its gradient exist
  one chunk at a time; backward recomputes each chunk's softmax from the kept log-sum-exp.

Rows whose target is ``ignore_index`` cost nothing and get zero gradient, as in ``F.cross_entropy``.
Under autocast the projection runs in the autocast dtype, as ``nn.Linear`` would; the softmax is
always fp32. No host syncs: chunk bounds come from shapes, masks are arithmetic.

Vocabulary-parallel (Megatron's ``vocab_parallel_cross_entropy``): inside ``vocab_split(split)``
the logits -- and the output matrix -- hold only the columns ``[split.start, split.end)`` of the
vocabulary this tensor rank owns (``parallel/tensor.py``). Each chunk's row maximum is all-reduced
(max), then its sum of exponentials and the target's logit (from the rank that owns the target,
0 elsewhere) in one all-reduce (sum); the logits are never gathered, and each rank's gradient is
its own columns of softmax - one-hot. ``predicted`` is the matching argmax. Outside a split
nothing is communicated.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

import torch
import torch.nn.functional as F

from glm_dist.parallel import comm

IGNORE_INDEX = -100  # torch's default: a position that is not predicted
CHUNK_TOKENS = 1024  # rows of fp32 logits per chunk: 1024 x 50257 x 4 B = 196 MiB
# Peak bytes per logit element of one chunk (bench/loss_memory.py measures it): the fp32 logits,
# worked on in place, and their 16-bit copy for the gradient's matmuls.
CHUNK_BYTES_PER_LOGIT = 6


@dataclass(frozen=True)
class VocabSplit:
    """The columns ``[start, end)`` of a ``vocab``-token vocabulary held by this rank of ``group``."""

    group: Any
    start: int
    end: int
    vocab: int

    @property
    def width(self) -> int:
        return self.end - self.start


_split: VocabSplit | None = None  # the vocabulary split the losses are computed under (``vocab_split``)


@contextlib.contextmanager
def vocab_split(split: VocabSplit | None) -> Iterator[None]:
    """Compute every loss and ``predicted`` inside the block from this rank's vocabulary columns
    (``None``: whole logits, nothing changes)."""
    global _split
    before, _split = _split, split
    try:
        yield
    finally:
        _split = before


def _active(width: int) -> VocabSplit | None:
    """The split in force, checked against the logits' (or output matrix's) vocabulary width."""
    if _split is not None and width != _split.width:
        raise ValueError(f"logits of width {width} inside a vocabulary split of {_split.width} columns "
                         f"[{_split.start}, {_split.end}) of {_split.vocab}: not this rank's vocabulary shard")
    return _split


class LinearCE(NamedTuple):
    nll: torch.Tensor  # () fp32, the summed NLL: differentiable
    rows: torch.Tensor  # (N,) fp32 NLL per row, 0 where ignored: for metrics, not differentiable
    count: torch.Tensor  # () the predicted rows (targets != ignore_index), on the device


def _targets(targets: torch.Tensor, ignore_index: int, split: VocabSplit | None):
    """-> (valid (n,): predicted rows, owned (n,): rows whose target is in this rank's columns,
    safe (n,): the target's column here, 0 where not owned, so it can index)."""
    valid = targets != ignore_index
    if split is None:
        return valid, valid, torch.where(valid, targets, 0)
    local = targets - split.start
    owned = valid & (local >= 0) & (local < split.width)
    return valid, owned, torch.where(owned, local, 0)


def _nll_(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int, *, softmax: bool = False,
          split: VocabSplit | None = None, dim: int = 1):
    """In place on fp32 logits whose ``dim`` runs over the vocabulary -- (n, V), or (V, n) with
    ``dim=0`` (this rank's V columns under ``split``) -- which become exp(logits - max) or, ``softmax``,
    the probabilities, with no other logits-sized tensor made:
    -> (row NLL (n,), log-sum-exp (n,), valid (n,) bool, owned (n,) bool, safe targets (n,))."""
    valid, owned, safe = _targets(targets, ignore_index, split)
    picked = torch.where(owned, logits.gather(dim, safe.unsqueeze(dim)).squeeze(dim), 0.0)
    top = logits.amax(dim=dim)
    if split is not None:  # the row maximum over every rank's columns
        top = comm.all_reduce_(top, "max", group=split.group)
    total = logits.sub_(top.unsqueeze(dim)).exp_().sum(dim=dim)
    if split is not None:  # sum of exponentials and the target's logit (one rank owns it), in one call
        total, picked = comm.all_reduce_(torch.stack([total, picked]), "sum", group=split.group)
    if softmax:
        logits.div_(total.unsqueeze(dim))
    lse = top + total.log()
    return torch.where(valid, lse - picked, 0.0), lse, valid, owned, safe


def _dlogits_(probs: torch.Tensor, safe: torch.Tensor, owned: torch.Tensor, scale: torch.Tensor, *,
              dim: int = 1) -> torch.Tensor:
    """In place: fp32 softmax (vocabulary along ``dim``) -> scale * (softmax - one-hot), the gradient of
    each row's NLL times its ``scale`` (n,) (0 for ignored rows); the one-hot only where this rank
    ``owned`` the target."""
    probs.scatter_add_(dim, safe.unsqueeze(dim), -owned.to(probs.dtype).unsqueeze(dim))
    return probs.mul_(scale.unsqueeze(dim))


def _accumulate_(total: torch.Tensor, part: torch.Tensor, *, first: bool, scratch: torch.Tensor) -> None:
    """fp32 ``total`` += ``part`` (or = ``part``, ``first``). A 16-bit ``part`` is widened into the
    fp32 ``scratch`` buffer when it fits: a mixed-dtype ``add_`` makes a fresh fp32 temporary of
    ``part``'s size, which cost 10x the add on a CPU (page faults on every new large block)."""
    if first:
        total.copy_(part)
    elif part.dtype == total.dtype or scratch.numel() < part.numel():
        total.add_(part)
    else:
        total.add_(scratch[:part.numel()].view(part.shape).copy_(part))


class _LinearCrossEntropy(torch.autograd.Function):
    """The chunk's logits are made transposed, (V, n) = weight @ h.T, into two buffers reused by every
    chunk (the matmul's output in the compute dtype, its fp32 copy), and the gradient matmuls write
    into buffers too. With the vocabulary as the matmul's long M side, its logits matmul ran in 32 ms
    against 69 for ``F.linear``'s (n, V) on this CPU (1024 x 768 -> 50257, bf16, AMX), and without a
    fresh large block per chunk (each costs its page faults on a CPU) the whole loss over 2048 tokens
    took 0.74 s against 1.11 s; on a GPU the caching allocator already reuses memory."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int, ignore_index: int, grads: bool, split):
        # hidden (N, C), weight (V, C), bias (V,) or None, targets (N,); under ``split`` V is this
        # rank's columns and grad_h its partial sum (the module around it all-reduces it backward)
        want_h, want_w, want_b = (grads and need for need in ctx.needs_input_grad[:3])
        grads = want_h or want_w or want_b
        n_rows, vocab = hidden.shape[0], weight.shape[0]
        chunk = min(chunk, n_rows) or 1
        one_chunk = chunk == n_rows
        rows = torch.empty(n_rows, dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if want_h else None
        # over several chunks the output matrix's gradient accumulates in fp32; one chunk's is its matmul
        grad_w = torch.empty(weight.shape, dtype=torch.float32, device=weight.device) if want_w and not one_chunk else None
        grad_w_part = torch.empty_like(weight) if want_w else None
        grad_b = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) if want_b else None
        # the chunk's logits, (V, n) views of flat buffers: in the compute dtype, and in fp32 (the same
        # buffer when that is fp32); a shorter last chunk takes the buffers' leading V x n elements
        low = torch.empty(vocab * chunk, dtype=hidden.dtype, device=hidden.device)
        high = low if hidden.dtype == torch.float32 else torch.empty(vocab * chunk, dtype=torch.float32,
                                                                     device=hidden.device)
        for start in range(0, n_rows, chunk):
            h, t = hidden[start:start + chunk], targets[start:start + chunk]
            n = h.shape[0]
            logits_low, logits = low[:vocab * n].view(vocab, n), high[:vocab * n].view(vocab, n)
            torch.mm(weight, h.T, out=logits_low)
            if logits is not logits_low:
                logits.copy_(logits_low)
            if bias is not None:
                logits.add_(bias.unsqueeze(1))
            rows[start:start + n], _, valid, owned, safe = _nll_(logits, t, ignore_index, softmax=grads,
                                                                 split=split, dim=0)
            if not grads:
                continue
            g = _dlogits_(logits, safe, owned, valid.float(), dim=0)  # (V, n) fp32
            if grad_b is not None:
                grad_b += g.sum(1)
            if g is not logits_low:  # the projection's backward runs in its forward's dtype
                g = logits_low.copy_(g)
            if grad_h is not None:
                torch.mm(g.T, weight, out=grad_h[start:start + n])  # (n, C)
            if grad_w_part is not None:
                torch.mm(g, h, out=grad_w_part)  # (V, C)
                if grad_w is not None:
                    _accumulate_(grad_w, grad_w_part, first=start == 0, scratch=high)
        ctx.mark_non_differentiable(rows)
        if grad_w is None:
            grad_w = grad_w_part  # one chunk's matmul, or None
        elif grad_w.dtype != weight.dtype:
            grad_w = grad_w_part.copy_(grad_w)
        ctx.save_for_backward(grad_h, grad_w, None if grad_b is None else grad_b.to(bias.dtype))
        return rows.sum(), rows

    @staticmethod
    def backward(ctx, grad_nll, _grad_rows):
        scaled = [None if g is None else g * grad_nll.to(g.dtype) for g in ctx.saved_tensors]
        return (*scaled, None, None, None, None, None)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would compute in here: autocast's when it is on for x's device."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                         bias: torch.Tensor | None = None, chunk_tokens: int = CHUNK_TOKENS,
                         ignore_index: int = IGNORE_INDEX) -> LinearCE:
    """NLL of ``targets`` under ``softmax(hidden @ weight.T + bias)``: hidden (..., C), weight
    (V, C), targets (...) -> ``LinearCE`` (summed NLL, per-row NLL, count); the mean loss is
    ``nll / count.clamp(min=1)``. Inside ``vocab_split`` weight (and bias) are this rank's rows."""
    dtype = _compute_dtype(hidden)
    h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
    t = targets.reshape(-1)
    grads = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (h, w, b))
    with torch.autocast(hidden.device.type, enabled=False):
        nll, rows = _LinearCrossEntropy.apply(h, w, b, t, max(1, chunk_tokens), ignore_index, grads,
                                              _active(weight.shape[0]))
    return LinearCE(nll, rows, (t != ignore_index).sum())


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, chunk: int, ignore_index: int, split):
        # logits (N, V) in any float dtype (V: this rank's columns under ``split``), targets (N,)
        # -> (N,) fp32 NLL per row
        rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(rows)
        for start in range(0, logits.shape[0], chunk):
            end = start + chunk  # a copy, also of fp32 logits: _nll_ works in place
            rows[start:end], lse[start:end], *_ = _nll_(logits[start:end].to(torch.float32, copy=True),
                                                        targets[start:end], ignore_index, split=split)
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk, ctx.ignore_index, ctx.split = chunk, ignore_index, split
        return rows

    @staticmethod
    def backward(ctx, grad_rows):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk):
            end = start + ctx.chunk
            valid, owned, safe = _targets(targets[start:end], ctx.ignore_index, ctx.split)
            probs = logits[start:end].to(torch.float32, copy=True).sub_(lse[start:end, None]).exp_()
            g = _dlogits_(probs, safe, owned, grad_rows[start:end].float() * valid)
            grad[start:end] = g.to(logits.dtype)
            del probs, g  # before the next chunk's
        return grad, None, None, None, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, chunk_tokens: int = CHUNK_TOKENS,
                  ignore_index: int = IGNORE_INDEX, reduction: str = "sum") -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets, reduction=...)`` over (..., V) logits, fp32 a chunk
    at a time. ``reduction``: ``sum``, ``mean`` (over the predicted rows) or ``none`` (targets' shape).
    Inside ``vocab_split`` the logits are this rank's columns."""
    t = targets.reshape(-1)
    rows = _CrossEntropy.apply(logits.reshape(-1, logits.shape[-1]), t, max(1, chunk_tokens), ignore_index,
                               _active(logits.shape[-1]))
    if reduction == "none":
        return rows.view(targets.shape)
    if reduction == "sum":
        return rows.sum()
    if reduction == "mean":
        return rows.sum() / (t != ignore_index).sum().clamp(min=1)
    raise ValueError(f"reduction={reduction!r}: use 'sum', 'mean' or 'none'")


@torch.no_grad()
def predicted(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``; inside ``vocab_split`` over every rank's columns (the lowest id among
    equal maxima, as argmax): two all-reduces of (...,) values, no gather."""
    split = _active(logits.shape[-1])
    best, idx = logits.max(dim=-1)
    if split is None:
        return idx
    best = best.float()
    top = comm.all_reduce_(best.clone(), "max", group=split.group)
    mine = torch.where(best == top, idx + split.start, split.vocab)
    return comm.all_reduce_(mine, "min", group=split.group)


def loss_logits_bytes(tokens: int, vocab: int, *, d_model: int, fused: bool, logit_bytes: int = 2,
                      chunk_tokens: int = CHUNK_TOKENS) -> float:
    """Peak bytes of the loss over ``tokens`` rows: one chunk of fp32 logits, plus -- ``fused`` --
    the output matrix's gradient made in the forward (fp32 accumulator, then kept and scaled in
    16-bit), or -- not fused -- the model's whole (tokens x vocab) logits and their gradient in
    ``logit_bytes`` each."""
    chunk = CHUNK_BYTES_PER_LOGIT * min(tokens, chunk_tokens) * vocab
    if fused:
        return chunk + 8 * vocab * d_model
    return chunk + 2 * logit_bytes * tokens * vocab
