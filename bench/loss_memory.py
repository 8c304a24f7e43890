"""Peak memory and time of the loss over a large vocabulary: the fused, chunked cross entropy
(``glm_dist/ops/cross_entropy.py``) beside the plain one (projection to the whole (tokens x vocab)
logits, then ``F.cross_entropy`` in fp32), forward and backward, in one process.

Peak memory is the process's resident set above what it held before the step (``peak_memory.py``).
Also printed: what ``glm plan`` counts for the fused loss.

    python bench/loss_memory.py                       # vocab 50257, seq 2048 x micro-batch 8, d 768, bf16
    python bench/loss_memory.py --dtype fp32 --json   # one JSON line (the test reads it)
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from glm_dist.ops.cross_entropy import CHUNK_TOKENS, linear_cross_entropy, loss_logits_bytes
from peak_memory import MiB, PeakRSS, exec_with_mmap_threshold  # bench/, the script's folder


def plain_step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    logits = F.linear(h, w)  # (N, V) in the model's dtype
    loss = F.cross_entropy(logits.float(), t)
    loss.backward()
    return loss.detach()


def fused_step(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, chunk: int) -> torch.Tensor:
    ce = linear_cross_entropy(h, w, t, chunk_tokens=chunk)
    loss = ce.nll / ce.count
    loss.backward()
    return loss.detach()


def measure(step, h: torch.Tensor, w: torch.Tensor, t: torch.Tensor, *args) -> dict:
    h.grad = w.grad = None
    with PeakRSS() as rss:
        start = time.perf_counter()
        loss = step(h, w, t, *args)
        seconds = time.perf_counter() - start
    return {"loss": float(loss), "peak_mib": rss.peak / MiB, "seconds": seconds,
            "grads": (h.grad.float().clone(), w.grad.float().clone())}


def main() -> None:
    exec_with_mmap_threshold()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--tokens", type=int, default=2048 * 8, help="seq_len x micro-batch")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--chunk", type=int, default=CHUNK_TOKENS)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    h = torch.randn(args.tokens, args.d_model, dtype=dtype).requires_grad_()
    w = (torch.randn(args.vocab, args.d_model) * 0.02).to(dtype).requires_grad_()
    t = torch.randint(0, args.vocab, (args.tokens,))
    fused = measure(fused_step, h, w, t, args.chunk)
    plain = measure(plain_step, h, w, t)
    grad_diff = max((a - b).abs().max().item() for a, b in zip(fused.pop("grads"), plain.pop("grads")))
    planned = loss_logits_bytes(args.tokens, args.vocab, d_model=args.d_model, fused=True, chunk_tokens=args.chunk)
    out = {**{k: getattr(args, k) for k in ("vocab", "tokens", "d_model", "chunk", "dtype")},
           "fused": fused, "plain": plain, "saved_mib": plain["peak_mib"] - fused["peak_mib"],
           "max_grad_diff": grad_diff, "planned_fused_mib": planned / MiB}
    if args.json:
        print(json.dumps(out))
        return
    print(f"vocab {args.vocab}, {args.tokens} tokens, d_model {args.d_model}, {args.dtype}, chunk {args.chunk} tokens")
    print("| loss | peak MiB (forward + backward) | seconds | value |\n|---|---:|---:|---:|")
    for name in ("plain", "fused"):
        r = out[name]
        print(f"| {name} | {r['peak_mib']:,.0f} | {r['seconds']:.2f} | {r['loss']:.6f} |")
    print(f"\nsaved {out['saved_mib']:,.0f} MiB ({plain['peak_mib'] / max(fused['peak_mib'], 1):.1f}x less); "
          f"glm plan counts {out['planned_fused_mib']:,.0f} MiB for the fused loss; max |grad diff| {grad_diff:.2e}")


if __name__ == "__main__":
    main()
