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

Per-group sums (``row_groups``): inside the block each loss also adds its per-token NLL and count
by the group of each token's batch row -- a data mixture's per-source train loss from the same pass.

A padded vocabulary (Megatron's ``make-vocab-size-divisible-by``: GPT-2's 50257 rows stored as 50304
so the output matmuls get tensor-core-friendly shapes): inside ``vocab_padding(columns)`` the last
``columns`` of the whole vocabulary are padding. Their logits are set to -inf before every softmax,
so the loss, its gradient (0 on the padding rows of the output matrix) and ``predicted`` are those
of the unpadded model; ``real_logits`` cuts them off a model's output.

Two ways to run a chunk of ``linear_cross_entropy``. On the CPU, a chain of in-place passes over the
chunk's transposed fp32 logits (cast up, max, subtract, exp, sum, divide, one-hot, scale, cast
down: 52 bytes moved per logit element in bf16, ``bytes_per_logit``), tuned for its page faults.
On CUDA (with Triton, outside a vocabulary split), one ``torch.compile``d function of the chunk
(``_softmax_xent_``): the 16-bit (n, V) logits in, its NLL out and the logits overwritten by their
gradient -- three reads and one write of 16-bit elements (8 bytes), in chunks of ``FUSED_CHUNK_TOKENS``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

import torch


IGNORE_INDEX = -100  # the label of a position that is not predicted (torch's default); the one definition
CHUNK_TOKENS = 1024  # rows of fp32 logits per chunk: 1024 x 50257 x 4 B = 196 MiB
# Peak bytes per logit element of one chunk (bench/loss_memory.py measures it): the fp32 logits,
# worked on in place, and their 16-bit copy for the gradient's matmuls.
CHUNK_BYTES_PER_LOGIT = 6
# The compiled chunk keeps only its 16-bit logits, overwritten by their gradient (2 bytes per logit
# element against the eager chain's 6): 8x the eager chain's tokens for 2.7x its memory, and 8x fewer
# fp32 accumulations of the (V, C) gradient.
FUSED_CHUNK_TOKENS = 8192  # 8192 x 50304 x 2 B = 786 MiB


def bytes_per_logit(*, compiled: bool, itemsize: int) -> int:
    """Bytes one chunk's softmax cross entropy (forward and gradient) reads and writes per logit element
    of ``itemsize`` bytes, counted from its passes (``bench/loss_memory.py`` prints it): the eager
    chain's fp32 passes (max 4, subtract 8, exp 8, sum 4, divide 8, scale 8) and, for 16-bit logits,
    the casts up and back (2+4, 4+2): 52 in bf16; the compiled kernel's three reads (max, sum of
    exponentials, gradient) and one write (the gradient): 8 in bf16."""
    if compiled:
        return 4 * itemsize
    return 40 + (12 if itemsize < 4 else 0)


@dataclass(frozen=True)
class VocabSplit:
    """The columns ``[start, end)`` of a ``vocab``-token vocabulary held by this rank of ``group``;
    ``all_reduce(tensor, op, group=)`` is ``parallel/comm.py``'s (decision 13), handed in by the
    owner of the split so that ops/ stays below parallel/."""

    group: Any
    start: int
    end: int
    vocab: int
    all_reduce: Callable[..., torch.Tensor]

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
        raise ValueError(
            f"logits of width {width} inside a vocabulary split of {_split.width} columns "
            f"[{_split.start}, {_split.end}) of {_split.vocab}: not this rank's vocabulary shard"
        )
    return _split


_padding = 0  # trailing columns of the whole vocabulary that are padding (``vocab_padding``)


@contextlib.contextmanager
def vocab_padding(columns: int) -> Iterator[None]:
    """Inside the block the last ``columns`` of the whole vocabulary (the logits' columns, or under
    ``vocab_split`` the split's ``vocab``) are padding: never in a softmax, never ``predicted``."""
    global _padding
    before, _padding = _padding, columns
    try:
        yield
    finally:
        _padding = before


def _real_width(width: int, split: VocabSplit | None) -> int:
    """How many of these ``width`` columns (this rank's under ``split``) are real vocabulary: the
    leading ones (padding only ever follows the real vocabulary)."""
    if not _padding:
        return width
    if split is None:
        return width - _padding
    return max(0, min(width, split.vocab - _padding - split.start))


def _mask_padding(logits: torch.Tensor, real: int) -> torch.Tensor:
    """(..., V) logits with the columns from ``real`` on at -inf (a copy; the same tensor when none is padding)."""
    if real == logits.shape[-1]:
        return logits
    return logits.masked_fill(torch.arange(logits.shape[-1], device=logits.device) >= real, float("-inf"))


def real_logits(logits: torch.Tensor) -> torch.Tensor:
    """A model's (..., V) logits without the padding of ``vocab_padding``: the real columns (a view),
    or under ``vocab_split`` this rank's columns with the padding's at -inf (the width a split loss
    expects)."""
    split = _active(logits.shape[-1])
    real = _real_width(logits.shape[-1], split)
    return _mask_padding(logits, real) if split is not None else logits[..., :real]


_groups: tuple[torch.Tensor, torch.Tensor] | None = None  # (row groups (B,), their sums (G, 2)): ``row_groups``


@contextlib.contextmanager
def row_groups(groups: torch.Tensor, num_groups: int) -> Iterator[torch.Tensor]:
    """Inside the block every loss of this module also adds its per-token NLL and predicted-token
    count into the (num_groups, 2) float64 tensor it yields -- [summed NLL, tokens] per group -- by
    the group of the batch row each token is in (``groups``: (B,) ids in ``[0, num_groups)``, on the
    loss's device). The per-token NLL exists already (the summed loss is its sum), so this costs an
    index_add over the rows and no host sync: a data mixture's train loss per source (train/loop.py).
    A loss's tokens must be batch-major -- B rows of N / B tokens each, as (B, T) labels and (B, K)
    masked positions flatten; a loss over another layout is refused."""
    global _groups
    sums = torch.zeros(num_groups, 2, dtype=torch.float64, device=groups.device)
    before, _groups = _groups, (groups, sums)
    try:
        yield sums
    finally:
        _groups = before


def _add_to_groups(rows: torch.Tensor, valid: torch.Tensor) -> None:
    """(N,) per-token NLL (0 where not predicted) and (N,) predicted flags into ``row_groups``' sums."""
    if _groups is None:
        return
    groups, sums = _groups
    if rows.numel() % groups.numel():
        raise ValueError(
            f"a loss over {rows.numel()} tokens inside row_groups of {groups.numel()} batch rows: "
            f"its tokens are not batch-major"
        )
    per_row = torch.stack(
        [
            rows.detach().view(groups.numel(), -1).sum(1, dtype=torch.float64),
            valid.view(groups.numel(), -1).sum(1, dtype=torch.float64),
        ],
        dim=1,
    )  # (B, 2)
    sums.index_add_(0, groups, per_row)


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


def _nll_(
    logits: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int,
    *,
    softmax: bool = False,
    split: VocabSplit | None = None,
    dim: int = 1,
):
    """In place on fp32 logits whose ``dim`` runs over the vocabulary -- (n, V), or (V, n) with
    ``dim=0`` (this rank's V columns under ``split``) -- which become exp(logits - max) or, ``softmax``,
    the probabilities, with no other logits-sized tensor made:
    -> (row NLL (n,), log-sum-exp (n,), valid (n,) bool, owned (n,) bool, safe targets (n,))."""
    valid, owned, safe = _targets(targets, ignore_index, split)
    picked = torch.where(owned, logits.gather(dim, safe.unsqueeze(dim)).squeeze(dim), 0.0)
    top = logits.amax(dim=dim)
    if split is not None:  # the row maximum over every rank's columns
        top = split.all_reduce(top, "max", group=split.group)
    total = logits.sub_(top.unsqueeze(dim)).exp_().sum(dim=dim)
    if split is not None:  # sum of exponentials and the target's logit (one rank owns it), in one call
        total, picked = split.all_reduce(torch.stack([total, picked]), "sum", group=split.group)
    if softmax:
        logits.div_(total.unsqueeze(dim))
    lse = top + total.log()
    return torch.where(valid, lse - picked, 0.0), lse, valid, owned, safe


def _dlogits_(
    probs: torch.Tensor, safe: torch.Tensor, owned: torch.Tensor, scale: torch.Tensor, *, dim: int = 1
) -> torch.Tensor:
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
        total.add_(scratch[: part.numel()].view(part.shape).copy_(part))


@dataclass
class _Grads:
    """What a chunk loop fills: each row's NLL and the gradients wanted (None: not wanted)."""

    rows: torch.Tensor  # (N,) fp32
    h: torch.Tensor | None  # (N, C), hidden's dtype
    w: torch.Tensor | None  # (V, C) fp32, accumulated over several chunks (None for one chunk: its matmul is it)
    w_part: torch.Tensor | None  # (V, C), one chunk's, the weight's dtype
    b: torch.Tensor | None  # (V,) fp32

    @property
    def wanted(self) -> bool:
        return self.h is not None or self.w_part is not None or self.b is not None


def _backprop_chunk(
    g: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, out: _Grads, *, start: int, scratch: torch.Tensor
) -> None:
    """The projection's backward for one chunk: g (V, n), d NLL / d logits transposed in the projection's
    dtype (or a transposed view), h (n, C) the chunk's input rows -> its rows of the input's gradient
    and its share of the output matrix's."""
    if out.h is not None:
        torch.mm(g.T, weight, out=out.h[start : start + g.shape[1]])  # (n, C)
    if out.w_part is not None:
        torch.mm(g, h, out=out.w_part)  # (V, C)
        if out.w is not None:
            _accumulate_(out.w, out.w_part, first=start == 0, scratch=scratch)


def _transposed_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    out: _Grads,
    *,
    chunk: int,
    ignore_index: int,
    split: VocabSplit | None,
) -> None:
    """The eager loop, tuned on the CPU (and the one under a vocabulary split). The chunk's logits are
    made transposed, (V, n) = weight @ h.T, into two buffers reused by every chunk (the matmul's output
    in the compute dtype, its fp32 copy), and the gradient matmuls write into buffers too. With the
    vocabulary as the matmul's long M side, its logits matmul ran in 32 ms against 69 for ``F.linear``'s
    (n, V) on this CPU (1024 x 768 -> 50257, bf16, AMX), and without a fresh large block per chunk (each
    costs its page faults on a CPU) the whole loss over 2048 tokens took 0.74 s against 1.11 s."""
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    real = _real_width(vocab, split)
    # (V, n) views of flat buffers: in the compute dtype, and in fp32 (the same buffer when that is
    # fp32); a shorter last chunk takes the buffers' leading V x n elements
    low = torch.empty(vocab * chunk, dtype=hidden.dtype, device=hidden.device)
    high = (
        low if hidden.dtype == torch.float32 else torch.empty(vocab * chunk, dtype=torch.float32, device=hidden.device)
    )
    for start in range(0, n_rows, chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        n = h.shape[0]
        logits_low, logits = low[: vocab * n].view(vocab, n), high[: vocab * n].view(vocab, n)
        torch.mm(weight, h.T, out=logits_low)
        if logits is not logits_low:
            logits.copy_(logits_low)
        if bias is not None:
            logits.add_(bias.unsqueeze(1))
        logits[real:].fill_(float("-inf"))  # the vocabulary's padding rows, if any
        out.rows[start : start + n], _, valid, owned, safe = _nll_(
            logits, t, ignore_index, softmax=out.wanted, split=split, dim=0
        )
        if not out.wanted:
            continue
        g = _dlogits_(logits, safe, owned, valid.float(), dim=0)  # (V, n) fp32
        if out.b is not None:
            out.b += g.sum(1)
        if g is not logits_low:  # the projection's backward runs in its forward's dtype
            g = logits_low.copy_(g)
        _backprop_chunk(g, h, weight, out, start=start, scratch=high)


def _softmax_xent_(
    logits: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None, real: int, ignore_index: int, grads: bool
) -> torch.Tensor:
    """One chunk's softmax cross entropy as one fused kernel once compiled (``_compiled_softmax_xent``):
    (n, V) logits in the compute dtype (+ bias (V,)), targets (n,) -> (n,) fp32 NLL, 0 where ignored;
    ``grads``: the logits are overwritten by softmax - one-hot (0 on ignored rows), the gradient of each
    row's NLL. Columns from ``real`` on are padding. exp is recomputed from the logits in the gradient's
    pass rather than kept, so nothing logits-sized is written but the gradient."""
    x = logits.float() if bias is None else logits.float() + bias.float()
    col = torch.arange(x.shape[1], device=x.device)
    if real < x.shape[1]:
        x = torch.where(col < real, x, float("-inf"))
    valid = targets != ignore_index
    safe = torch.where(valid, targets, 0)
    top = x.amax(1, keepdim=True)  # (n, 1)
    lse = top + (x - top).exp().sum(1, keepdim=True).log()
    rows = torch.where(valid, (lse - x.gather(1, safe[:, None])).squeeze(1), 0.0)
    if grads:
        logits.copy_(((x - lse).exp() - (col == safe[:, None]).float()) * valid[:, None])
    return rows


@functools.cache
def _compiled_softmax_xent():
    """``_softmax_xent_`` compiled by inductor: a Triton kernel on CUDA, C++ on the CPU; one graph per
    chunk shape (dynamic=False: a run's chunks have at most two)."""
    return torch.compile(_softmax_xent_, dynamic=False, fullgraph=True)


def _compiled_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    out: _Grads,
    *,
    chunk: int,
    ignore_index: int,
) -> None:
    """The GPU's loop: each chunk's logits (n, V) = h @ weight.T -- rows contiguous for the kernel's
    reductions, V a multiple of 128 when the model pads its vocabulary -- into one buffer every chunk
    reuses, which the compiled ``_softmax_xent_`` turns into the chunk's NLL and, in place, its gradient.
    Inside a compiled model (``train.compile=model``) the function itself goes into the model's graph,
    which fuses it: dynamo would otherwise trace through the cache and the nested compile."""
    n_rows, vocab = hidden.shape[0], weight.shape[0]
    kernel = _softmax_xent_ if torch.compiler.is_compiling() else _compiled_softmax_xent()
    real = _real_width(vocab, None)
    buf = torch.empty(chunk * vocab, dtype=hidden.dtype, device=hidden.device)
    no_scratch = buf.new_empty(0, dtype=torch.float32)  # a mixed-dtype add_ makes no temporary on a GPU
    for start in range(0, n_rows, chunk):
        h, t = hidden[start : start + chunk], targets[start : start + chunk]
        n = h.shape[0]
        logits = torch.mm(h, weight.T, out=buf[: vocab * n].view(n, vocab))  # (n, V)
        out.rows[start : start + n] = kernel(logits, t, bias, real, ignore_index, out.wanted)
        if not out.wanted:
            continue
        if out.b is not None:
            out.b += logits.sum(0, dtype=torch.float32)
        _backprop_chunk(logits.T, h, weight, out, start=start, scratch=no_scratch)


class _LinearCrossEntropy(torch.autograd.Function):
    """Forward makes the loss and its gradients a chunk at a time (``_transposed_chunks`` or
    ``_compiled_chunks``); backward scales them by the incoming gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk: int, ignore_index: int, grads: bool, split, compiled: bool):
        # hidden (N, C), weight (V, C), bias (V,) or None, targets (N,); under ``split`` V is this
        # rank's columns and grad_h its partial sum (the module around it all-reduces it backward)
        want_h, want_w, want_b = (grads and need for need in ctx.needs_input_grad[:3])
        n_rows = hidden.shape[0]
        chunk = min(chunk, n_rows) or 1
        out = _Grads(
            rows=torch.empty(n_rows, dtype=torch.float32, device=hidden.device),
            h=torch.empty_like(hidden) if want_h else None,
            w=torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
            if want_w and chunk < n_rows
            else None,
            w_part=torch.empty_like(weight) if want_w else None,
            b=torch.zeros(weight.shape[0], dtype=torch.float32, device=hidden.device) if want_b else None,
        )
        if compiled:
            _compiled_chunks(hidden, weight, bias, targets, out, chunk=chunk, ignore_index=ignore_index)
        else:
            _transposed_chunks(hidden, weight, bias, targets, out, chunk=chunk, ignore_index=ignore_index, split=split)
        ctx.mark_non_differentiable(out.rows)
        grad_w = out.w_part if out.w is None else out.w
        if grad_w is not None and grad_w.dtype != weight.dtype:
            grad_w = out.w_part.copy_(grad_w)
        ctx.save_for_backward(out.h, grad_w, None if out.b is None else out.b.to(bias.dtype))
        return out.rows.sum(), out.rows

    @staticmethod
    def backward(ctx, grad_nll, _grad_rows):
        scaled = [None if g is None else g * grad_nll.to(g.dtype) for g in ctx.saved_tensors]
        return (*scaled, None, None, None, None, None, None)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype ``nn.Linear`` would compute in here: autocast's when it is on for x's device."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    chunk_tokens: int | None = None,
    ignore_index: int = IGNORE_INDEX,
    compiled: bool | None = None,
) -> LinearCE:
    """NLL of ``targets`` under ``softmax(hidden @ weight.T + bias)``: hidden (..., C), weight
    (V, C), targets (...) -> ``LinearCE`` (summed NLL, per-row NLL, count); the mean loss is
    ``nll / count.clamp(min=1)``. Inside ``vocab_split`` weight (and bias) are this rank's rows.
    ``compiled``: each chunk through the compiled kernel (None: on CUDA with Triton, outside a vocabulary
    split, whose all-reduces fall between the kernel's reductions); ``chunk_tokens`` (None):
    ``FUSED_CHUNK_TOKENS`` for it, ``CHUNK_TOKENS`` for the eager chain."""
    split = _active(weight.shape[0])
    if compiled is None:
        compiled = hidden.is_cuda and split is None and importlib.util.find_spec("triton") is not None
    if compiled and split is not None:
        raise ValueError(
            "the compiled loss kernel runs outside a vocabulary split (compiled=None picks the eager chain there)"
        )
    chunk = chunk_tokens or (FUSED_CHUNK_TOKENS if compiled else CHUNK_TOKENS)
    dtype = _compute_dtype(hidden)
    h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
    t = targets.reshape(-1)
    grads = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (h, w, b))
    with torch.autocast(hidden.device.type, enabled=False):
        nll, rows = _LinearCrossEntropy.apply(h, w, b, t, max(1, chunk), ignore_index, grads, split, compiled)
    _add_to_groups(rows, t != ignore_index)
    return LinearCE(nll, rows, (t != ignore_index).sum())


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, chunk: int, ignore_index: int, split):
        # logits (N, V) in any float dtype (V: this rank's columns under ``split``), targets (N,)
        # -> (N,) fp32 NLL per row
        rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(rows)
        real = _real_width(logits.shape[1], split)
        for start in range(0, logits.shape[0], chunk):
            end = start + chunk
            x = logits[start:end].to(torch.float32, copy=True)  # a copy, also of fp32 logits: _nll_ works in place
            x[:, real:] = float("-inf")  # the vocabulary's padding, if any
            rows[start:end], lse[start:end], *_ = _nll_(x, targets[start:end], ignore_index, split=split)
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk, ctx.ignore_index, ctx.split, ctx.real = chunk, ignore_index, split, real
        return rows

    @staticmethod
    def backward(ctx, grad_rows):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk):
            end = start + ctx.chunk
            valid, owned, safe = _targets(targets[start:end], ctx.ignore_index, ctx.split)
            probs = logits[start:end].to(torch.float32, copy=True).sub_(lse[start:end, None]).exp_()
            probs[:, ctx.real :] = 0.0
            g = _dlogits_(probs, safe, owned, grad_rows[start:end].float() * valid)
            grad[start:end] = g.to(logits.dtype)
            del probs, g  # before the next chunk's
        return grad, None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    chunk_tokens: int = CHUNK_TOKENS,
    ignore_index: int = IGNORE_INDEX,
    reduction: str = "sum",
) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets, reduction=...)`` over (..., V) logits, fp32 a chunk
    at a time. ``reduction``: ``sum``, ``mean`` (over the predicted rows) or ``none`` (targets' shape).
    Inside ``vocab_split`` the logits are this rank's columns; inside ``vocab_padding`` the padding's
    are left out of the softmax."""
    t = targets.reshape(-1)
    rows = _CrossEntropy.apply(
        logits.reshape(-1, logits.shape[-1]), t, max(1, chunk_tokens), ignore_index, _active(logits.shape[-1])
    )
    _add_to_groups(rows, t != ignore_index)
    if reduction == "none":
        return rows.view(targets.shape)
    if reduction == "sum":
        return rows.sum()
    if reduction == "mean":
        return rows.sum() / (t != ignore_index).sum().clamp(min=1)
    raise ValueError(f"reduction={reduction!r}: use 'sum', 'mean' or 'none'")


@torch.no_grad()
def predicted(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, never a padding column (``vocab_padding``); inside ``vocab_split`` over every
    rank's columns (the lowest id among equal maxima, as argmax): two all-reduces of (...,) values, no gather."""
    split = _active(logits.shape[-1])
    best, idx = _mask_padding(logits, _real_width(logits.shape[-1], split)).max(dim=-1)
    if split is None:
        return idx
    best = best.float()
    top = split.all_reduce(best.clone(), "max", group=split.group)
    mine = torch.where(best == top, idx + split.start, split.vocab)
    return split.all_reduce(mine, "min", group=split.group)


def loss_logits_bytes(
    tokens: int, vocab: int, *, d_model: int, fused: bool, logit_bytes: int = 2, chunk_tokens: int = CHUNK_TOKENS
) -> float:
    """Peak bytes of the loss over ``tokens`` rows: one chunk of fp32 logits, plus -- ``fused`` --
    the output matrix's gradient made in the forward (fp32 accumulator, then kept and scaled in
    16-bit), or -- not fused -- the model's whole (tokens x vocab) logits and their gradient in
    ``logit_bytes`` each."""
    chunk = CHUNK_BYTES_PER_LOGIT * min(tokens, chunk_tokens) * vocab
    if fused:
        return chunk + 8 * vocab * d_model
    return chunk + 2 * logit_bytes * tokens * vocab
