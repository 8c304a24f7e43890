"""GPT-3's sparse (locally banded) layers: blocked sliding-window attention against the dense
band mask they used before, forward + backward of the attention core, in one process.

- dense: ``scaled_dot_product_attention`` over all T x T scores with a (T, T) band mask.
- blocked: ``CausalSelfAttention._banded`` -- queries in blocks of W, each attending to its block
  and the previous one (T x 2W scores, an (T/W, W, 2W) mask).

Both give the same output (the max difference is printed). Peak memory is the resident set above
the step's start (``peak_memory.py``); time is the median of ``--repeats``, alternating the two.
SDPA picks its kernel (``--backend default``: on the CPU a flash kernel that takes masks, which keeps
no scores), or ``--backend math`` forces the kernel that keeps them (as a GPU does when no fused
kernel takes the inputs): there memory follows the score counts.

    python bench/banded_attention.py                  # seq 2048, window 256, 12 heads of 64, batch 4, fp32
    python bench/banded_attention.py --backend math --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from glm_dist.models.common import CausalSelfAttention
from peak_memory import MiB, PeakRSS, exec_with_mmap_threshold  # bench/, the script's folder


def dense(attn: CausalSelfAttention, q, k, v) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn._band(q.shape[2], q.device))


def blocked(attn: CausalSelfAttention, q, k, v) -> torch.Tensor:
    return attn._banded(q, k, v, 0.0)


def step(fn, attn, q, k, v) -> tuple[torch.Tensor, float, float]:
    """(output, seconds, peak MiB) of one forward + backward."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with PeakRSS() as rss:
        start = time.perf_counter()
        y = fn(attn, q, k, v)
        y.backward(torch.ones_like(y))
        seconds = time.perf_counter() - start
    return y.detach(), seconds, rss.peak / MiB


def main() -> None:
    exec_with_mmap_threshold()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", choices=["default", "math"], default="default")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    T, W, H = args.seq_len, args.window, args.heads
    attn = CausalSelfAttention(H * args.head_dim, H, window=W)
    q, k, v = (torch.randn(args.batch, H, T, args.head_dim) for _ in range(3))
    runs = {"dense": [], "blocked": []}
    with sdpa_kernel(SDPBackend.MATH) if args.backend == "math" else contextlib.nullcontext():
        for fn in (dense, blocked):  # warm-up, and the masks made once (cached by the layer, as in training)
            step(fn, attn, q, k, v)
        for _ in range(args.repeats):
            for fn in (dense, blocked):
                runs[fn.__name__].append(step(fn, attn, q, k, v))
    diff = (runs["dense"][0][0] - runs["blocked"][0][0]).abs().max().item()
    out = {
        "backend": args.backend,
        "seq_len": T,
        "window": W,
        "heads": H,
        "head_dim": args.head_dim,
        "batch": args.batch,
        "max_diff": diff,
        "score_elements": {"dense": T * T, "blocked": -(-T // W) * W * 2 * W},
    }
    for name, rs in runs.items():
        out[name] = {"seconds": statistics.median(r[1] for r in rs), "peak_mib": statistics.median(r[2] for r in rs)}
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"seq {T}, window {W}, {H} heads of {args.head_dim}, batch {args.batch}, fp32, forward + backward, "
        f"SDPA backend {args.backend}; "
        f"CPU threads {torch.get_num_threads()}"
    )
    print("| attention | scores per head | seconds (median) | peak MiB |\n|---|---:|---:|---:|")
    for name in runs:
        print(
            f"| {name} | {out['score_elements'][name]:,} | {out[name]['seconds']:.3f} | {out[name]['peak_mib']:,.0f} |"
        )
    print(
        f"\nblocked / dense: time {out['blocked']['seconds'] / out['dense']['seconds']:.2f}x, "
        f"memory {out['blocked']['peak_mib'] / max(out['dense']['peak_mib'], 1e-9):.2f}x; "
        f"max |difference| {diff:.1e}"
    )


if __name__ == "__main__":
    main()
