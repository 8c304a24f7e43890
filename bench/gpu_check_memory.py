"""Measured peak device memory of our training step against ``glm plan``'s estimate.

GPT-2 medium, large and XL in bf16 at ZeRO 0, 1, 2 and 3 on one device: each engine built (on the
device), one step, then the allocator's peak over three more steps (the step's activations, the
gradients and the optimizer states the first step made) against ``glm plan``'s total for the same
layout (DP=PP=TP=1, no offload, no activation checkpointing); also this rank's model-state bytes
(``parallel/memory.py``) against the plan's. The plan holds when the measured peak fits in the plan's
total divided by the 90% of a GPU ``glm plan`` recommends filling. The CPU keeps no allocator peak:
there only the model states are compared.

    python bench/gpu_check_memory.py --json memory.json                        # the GPU check's stage
    python bench/gpu_check_memory.py --json m.json --flavors gpt2-medium \\
        --shrink n_layer=1,d_model=64,n_head=4 --seq-len 64 --batch 2
"""

from __future__ import annotations

import argparse
import gc
import json

import torch

from bench.train_throughput import DEVICE, build_ours, engine_step_fn
from glm_dist.families.gpt.model import gpt_config
from glm_dist.families.registry import family
from glm_dist.observability.device_memory import GIB, device_memory
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.memory import rank_model_states
from glm_dist.parallel.plan import model_shape, plan

HEADROOM = 0.9  # of a GPU's memory, what glm plan's recommendation fills at most (parallel/plan.py)


def plan_layout(mcfg, zero: int, *, seq_len: int, batch: int):
    """``glm plan``'s layout of one GPU at ZeRO ``zero``: what ``glm plan --gpus 1`` lists for it."""
    layouts = plan(
        model_shape(family("gpt"), mcfg),
        gpus=1,
        seq_len=seq_len,
        micro_batch=batch,
        global_batch=batch,
        precision="bf16",
    )
    return next(lay for lay in layouts if (lay.zero, lay.offload) == (zero, "none"))


def collect() -> None:
    """Free the previous engine: its parameters and the methods DeepSpeed binds to them form cycles
    that one ``gc.collect()`` leaves alive (on the CPU the model's flat bf16 weights and BF16_Optimizer's
    fp32 gradient buffer outlived it into the next stage's peak), so collect until nothing is left."""
    while gc.collect():
        pass
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def measure(flavor: str, mcfg, zero: int, *, seq_len: int, batch: int, steps: int) -> dict:
    collect()
    # what an earlier stage left allocated (0 when it freed everything): counted in this stage's peak
    resident = torch.cuda.memory_allocated() / GIB if DEVICE == "cuda" else None
    engine = build_ours(mcfg, "bf16", batch, zero_stage=zero)
    step = engine_step_fn(engine, "bf16")
    x, y = (torch.randint(0, mcfg.vocab_size, (batch, seq_len), device=DEVICE) for _ in range(2))
    step(x, y)  # the optimizer states exist from here on
    device_memory(DEVICE)  # resets the peak
    for _ in range(steps):
        step(x, y)
    peak = device_memory(DEVICE)
    states = rank_model_states(engine)
    lay = plan_layout(mcfg, zero, seq_len=seq_len, batch=batch)
    row = {
        "flavor": flavor,
        "zero": zero,
        "states_gib": sum(states.values()) / GIB,
        "plan_states_gib": lay.model_states / GIB,
        "plan_gib": lay.total(False) / GIB,
    }
    if peak is not None:
        row |= {
            "peak_gib": peak["mem_max_allocated_gib"],
            "reserved_gib": peak["mem_max_reserved_gib"],
            "resident_before_gib": resident,
            "plan_holds": peak["mem_max_allocated_gib"] <= row["plan_gib"] / HEADROOM,
        }
    engine.destroy()
    del engine, step
    collect()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--flavors", default="gpt2-medium,gpt2-large,gpt2-xl")
    ap.add_argument("--zero", default="0,1,2,3")
    ap.add_argument("--shrink", default="", help="config fields over each flavor's, e.g. n_layer=1,d_model=64")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    init_distributed()
    shrink = {k: int(v) for k, v in (kv.split("=") for kv in args.shrink.split(",") if kv)}
    rows = []
    for flavor in args.flavors.split(","):
        mcfg = gpt_config(flavor, **shrink)
        for zero in map(int, args.zero.split(",")):
            rows.append(measure(flavor, mcfg, zero, seq_len=args.seq_len, batch=args.batch, steps=args.steps))
            print(json.dumps(rows[-1]), flush=True)
    with open(args.json, "w") as f:
        json.dump(
            {"device": DEVICE, "seq_len": args.seq_len, "batch": args.batch, "headroom": HEADROOM, "rows": rows},
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
