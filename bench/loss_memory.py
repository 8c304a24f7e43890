"""Peak memory and time of the loss over a large vocabulary: the fused, chunked cross entropy
(``glm_dist/ops/cross_entropy.py``) beside the plain one (projection to the whole (tokens x vocab)
logits, then ``F.cross_entropy`` in fp32), forward and backward, in one process. The fused loss runs
as the eager chain of passes the CPU uses and, with ``--compiled`` (always on CUDA), as the compiled
chunk kernel CUDA uses, timed after one call that compiles it; each fused row says how many bytes its
softmax cross entropy reads and writes per logit element (counted from its passes:
``bytes_per_logit``), on CUDA also inductor's own count of the kernel's bytes. With it, one chunk's
softmax cross entropy alone (what those bytes are moved by, the matmuls left out) is timed both ways:
the eager chain on the (V, n) logits the CPU's loop makes, the kernel on (n, V).

Peak memory is the process's resident set above what it held before the step (``peak_memory.py``),
on CUDA the allocator's peak above what was allocated before. Also printed: what ``glm plan``
counts for the fused loss.

    python bench/loss_memory.py                       # vocab 50257, seq 2048 x micro-batch 8, d 768, bf16
    python bench/loss_memory.py --compiled            # and the compiled kernel's row
    python bench/loss_memory.py --dtype fp32 --json   # one JSON line (the test reads it)
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from glm_dist.ops.cross_entropy import CHUNK_TOKENS, bytes_per_logit, linear_cross_entropy, loss_logits_bytes
from peak_memory import MiB, PeakRSS, exec_with_mmap_threshold  # bench/, the script's folder

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def plain_step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    logits = F.linear(h, w)  # (N, V) in the model's dtype
    loss = F.cross_entropy(logits.float(), t)
    loss.backward()
    return loss.detach()


def fused_step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, chunk: int, compiled: bool) -> torch.Tensor:
    ce = linear_cross_entropy(h, w, t, chunk_tokens=chunk, compiled=compiled)
    loss = ce.nll / ce.count
    loss.backward()
    return loss.detach()


class PeakCUDA:
    """The CUDA allocator's peak above what was allocated on entry (``peak``, bytes)."""

    def __enter__(self) -> PeakCUDA:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc) -> None:
        torch.cuda.synchronize()
        self.peak = torch.cuda.max_memory_allocated() - self.base


def measure(step, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, *args) -> dict:
    h.grad = w.grad = None
    with PeakCUDA() if DEVICE.type == "cuda" else PeakRSS() as peak:
        start = time.perf_counter()
        loss = step(h, w, t, *args)
        seconds = time.perf_counter() - start
    return {
        "loss": float(loss),
        "peak_mib": peak.peak / MiB,
        "seconds": seconds,
        "grads": (h.grad.float().clone(), w.grad.float().clone()),
    }


def measure_compiled(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, chunk: int) -> dict:
    """The compiled kernel's row: one call compiles it (its seconds reported apart), the next is measured."""
    from torch._inductor import metrics

    metrics.reset()
    start = time.perf_counter()
    fused_step(h, w, t, chunk, True)
    compile_s = time.perf_counter() - start
    kernel_bytes = metrics.num_bytes_accessed  # Triton kernels only: 0 for the CPU's C++
    n = min(chunk, h.shape[0]) * w.shape[0]
    return {
        **measure(fused_step, h, w, t, chunk, True),
        "compile_seconds": compile_s,
        "bytes_per_logit": bytes_per_logit(compiled=True, itemsize=h.element_size()),
        "inductor_bytes_per_logit": kernel_bytes / n if kernel_bytes else None,
    }


def time_chunk_softmax(chunk: int, vocab: int, dtype: torch.dtype, *, repeats: int = 3) -> dict:
    """Best-of-``repeats`` seconds of one chunk's softmax cross entropy and its gradient, matmuls left
    out: the eager chain (``_transposed_chunks``'s passes) against the compiled kernel."""
    from glm_dist.ops.cross_entropy import IGNORE_INDEX, _compiled_softmax_xent, _dlogits_, _nll_

    low = (torch.randn(vocab, chunk, device=DEVICE) * 2).to(dtype)  # (V, n), the eager chain's layout
    high = low if dtype == torch.float32 else torch.empty(vocab, chunk, device=DEVICE)
    t = torch.randint(0, vocab, (chunk,), device=DEVICE)

    def eager():
        logits = high.copy_(low) if high is not low else low
        _, _, valid, owned, safe = _nll_(logits, t, IGNORE_INDEX, softmax=True, dim=0)
        low.copy_(_dlogits_(logits, safe, owned, valid.float(), dim=0))

    kernel, logits = _compiled_softmax_xent(), low.T.contiguous()  # (n, V), the kernel's
    seconds = {}
    for name, step in (("eager", eager), ("compiled", lambda: kernel(logits, t, None, vocab, IGNORE_INDEX, True))):
        step()  # compiles the kernel, faults the buffers in
        runs = []
        for _ in range(repeats):
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            step()
            if DEVICE.type == "cuda":
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - start)
        seconds[name] = min(runs)
    return {"chunk": chunk, **seconds, "eager_over_compiled": seconds["eager"] / seconds["compiled"]}


def main() -> None:
    exec_with_mmap_threshold()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--tokens", type=int, default=2048 * 8, help="seq_len x micro-batch")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--chunk", type=int, default=CHUNK_TOKENS, help="tokens per chunk of the eager chain")
    ap.add_argument(
        "--compiled-chunk",
        type=int,
        default=None,
        help="tokens per chunk of the compiled kernel (default: FUSED_CHUNK_TOKENS)",
    )
    ap.add_argument("--compiled", action="store_true", help="add the compiled kernel's row (always on CUDA)")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    h = torch.randn(args.tokens, args.d_model, dtype=dtype, device=DEVICE).requires_grad_()
    w = (torch.randn(args.vocab, args.d_model, device=DEVICE) * 0.02).to(dtype).requires_grad_()
    t = torch.randint(0, args.vocab, (args.tokens,), device=DEVICE)
    rows = {
        "fused": {
            **measure(fused_step, h, w, t, args.chunk, False),
            "bytes_per_logit": bytes_per_logit(compiled=False, itemsize=h.element_size()),
        }
    }
    if args.compiled or DEVICE.type == "cuda":
        from glm_dist.ops.cross_entropy import FUSED_CHUNK_TOKENS

        rows["compiled"] = measure_compiled(h, w, t, args.compiled_chunk or FUSED_CHUNK_TOKENS)
        rows["compiled"]["chunk_softmax"] = time_chunk_softmax(args.chunk, args.vocab, dtype)
    rows["plain"] = measure(plain_step, h, w, t)
    plain_grads = rows["plain"].pop("grads")
    diffs = {
        name: max((a - b).abs().max().item() for a, b in zip(r.pop("grads"), plain_grads))
        for name, r in rows.items()
        if name != "plain"
    }
    planned = loss_logits_bytes(args.tokens, args.vocab, d_model=args.d_model, fused=True, chunk_tokens=args.chunk)
    out = {
        **{k: getattr(args, k) for k in ("vocab", "tokens", "d_model", "chunk", "dtype")},
        "device": DEVICE.type,
        **rows,
        "saved_mib": rows["plain"]["peak_mib"] - rows["fused"]["peak_mib"],
        "max_grad_diff": diffs["fused"],
        "compiled_max_grad_diff": diffs.get("compiled"),
        "planned_fused_mib": planned / MiB,
    }
    if args.json:
        print(json.dumps(out))
        return
    print_table(out, args)


def print_table(out: dict, args) -> None:
    print(
        f"vocab {args.vocab}, {args.tokens} tokens, d_model {args.d_model}, {args.dtype}, {out['device']}, "
        f"chunk {args.chunk} tokens (eager)"
    )
    print(
        "| loss | peak MiB (forward + backward) | seconds | time / plain | bytes per logit (softmax CE) | value |\n"
        "|---|---:|---:|---:|---:|---:|"
    )
    plain = out["plain"]
    for name in ("plain", "fused", "compiled"):
        r = out.get(name)
        if r is None:
            continue
        moved = "" if "bytes_per_logit" not in r else f"{r['bytes_per_logit']}"
        if r.get("inductor_bytes_per_logit"):
            moved += f" (inductor: {r['inductor_bytes_per_logit']:.1f})"
        print(
            f"| {name} | {r['peak_mib']:,.0f} | {r['seconds']:.3f} | {r['seconds'] / plain['seconds']:.2f} | "
            f"{moved or '-'} | {r['loss']:.6f} |"
        )
    print(
        f"\nsaved {out['saved_mib']:,.0f} MiB ({plain['peak_mib'] / max(out['fused']['peak_mib'], 1):.1f}x less); "
        f"glm plan counts {out['planned_fused_mib']:,.0f} MiB for the fused loss; max |grad diff| "
        f"{out['max_grad_diff']:.2e}"
    )
    if "compiled" in out:
        k = out["compiled"]["chunk_softmax"]
        print(
            f"compiled kernel: compiled in {out['compiled']['compile_seconds']:.1f} s, max |grad diff| "
            f"{out['compiled_max_grad_diff']:.2e}; one chunk's softmax cross entropy alone ({k['chunk']} tokens, "
            f"matmuls left out): eager chain {k['eager'] * 1e3:.1f} ms, compiled kernel {k['compiled'] * 1e3:.1f} "
            f"ms ({k['eager_over_compiled']:.2f}x)"
        )


if __name__ == "__main__":
    main()
