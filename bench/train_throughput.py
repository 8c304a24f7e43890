"""Training-step throughput: glm-dist's trainer vs transformers' GPT2LMHeadModel + torch AdamW.

Same GPT-2 config, batch, sequence length and dtype; steps alternate between the two in one
run (timings on a shared machine drift; alternating keeps the comparison fair). Prints tokens/s,
the ratio, and model FLOPs utilisation twice: against the matmul peak measured in the same run (the
best of several sizes and repeats, so a loaded machine moves it less), and against a fixed peak that
does not move between runs -- a GPU's datasheet figure, or on the CPU ``CPU_REFERENCE_PEAK``.

    python bench/train_throughput.py                 # GPT-2 small width, 4 layers, seq 256, batch 4
    python bench/train_throughput.py --n-layer 12 --rounds 3   # full GPT-2 small
    python bench/train_throughput.py --compile --modes fp32,bf16   # + our step with compiled blocks
    python bench/train_throughput.py --compile both   # + compiled blocks and the compiled whole model (with its loss)
    python bench/train_throughput.py --n-layer 12 --seq-len 1024 --batch 2 --modes bf16 --profile
        # + where our step's time goes: on the CPU its self time per operator group; on a GPU the
        # kernels' time per kind (gemm, attention, ...) and the GPU's idle share of the step

On a GPU (picked automatically when CUDA is available; DeepSpeed then uses nccl) the same table is
the issue's MFU figure of a GPT-2 124M bf16 step, against the measured and the datasheet peak:

    python bench/train_throughput.py --n-layer 12 --seq-len 1024 --batch 16 --modes bf16
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import time
from typing import Iterable, NamedTuple

import torch
import torch.nn.functional as F

from glm_dist.config.loader import load_config
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.objectives.clm import CLM
from glm_dist.observability.flops import matmul_dtype, measure_matmul_peak, peak_flops
from glm_dist.parallel.compile import compile_model
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine
from glm_dist.train.optim import build_optimizer


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The best matmul FLOP/s measured on this repository's CPU machine type (2 cores of an Intel Xeon
# with AVX-512 and AMX, KVM guest; torch 2.13 CPU build, 2 threads): the fixed reference a CPU run's
# MFU is also reported against. The fp32 figure is AVX-512 FMA, the bf16 one AMX tiles.
CPU_REFERENCE_PEAK = {torch.float32: 433e9, torch.bfloat16: 2727e9}


def build_ours(
    cfg_model, precision: str, batch: int, *, zero_stage: int = 0, lr: float = 1e-4, compile: str | None = None
):
    """Our trainer's DeepSpeed engine (AdamW, grad clip 1.0) of a GPT built on the device; ``compile``:
    the scope compiled as ``train.compile=blocks|model`` does (inductor)."""
    cfg = load_config(
        None,
        [
            f"train.precision={precision}",
            f"train.micro_batch_size={batch}",
            f"parallel.zero_stage={zero_stage}",
            "train.grad_clip=1.0",
            f"train.lr={lr}",
        ],
    )
    with torch.device(DEVICE):
        model = GPT(cfg_model)
    if compile:
        compile_model(model, scope=compile)
    return build_engine(model, build_optimizer(model, cfg.train), cfg, dp_size=1)


def engine_step_fn(engine, precision: str):
    """Our trainer's step on ``engine``: the clm objective's loss (the fused, chunked cross entropy),
    backward, the optimizer step."""
    ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if precision == "bf16-autocast" else contextlib.nullcontext()

    def step(x, y):
        with ctx:
            loss, _ = CLM.loss(engine, {"input_ids": x, "labels": y}, metrics=False)
        engine.backward(loss)
        engine.step()
        return loss.item()

    return step


def ours_step_fn(cfg_model, precision: str, batch: int, lr: float = 1e-4, compile: str | None = None):
    return engine_step_fn(build_ours(cfg_model, precision, batch, lr=lr, compile=compile), precision)


def hf_step_fn(cfg_model, precision: str, lr: float = 1e-4):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg_model.vocab_size,
            n_positions=cfg_model.context_length,
            n_embd=cfg_model.d_model,
            n_layer=cfg_model.n_layer,
            n_head=cfg_model.n_head,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    ).to(DEVICE)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    # transformers' Trainer with bf16=True runs the forward under autocast; it is the peer of both our modes.
    ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if precision != "fp32" else contextlib.nullcontext()

    def step(x, y):
        with ctx:
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


# Matmul sizes for the measured peak: a CPU core saturates at 1-2k, an H100/H200 needs 8k. Larger
# sizes are left out where they would pass the budget (a CPU without AMX or AVX512-BF16 emulates bf16).
PEAK_BUDGET_S = 15.0
PEAK_SIZES = {"cpu": (512, 1024, 2048, 4096), "cuda": (2048, 4096, 8192)}
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def reference_peak(mode: str) -> float | None:
    """The fixed peak a ``mode`` run is also scored against: the GPU's datasheet figure (TF32 when this
    process allows TF32 matmuls), or ``CPU_REFERENCE_PEAK``; None for a GPU the table lacks."""
    if DEVICE == "cuda":
        return peak_flops(torch.cuda.get_device_name(), mode, tf32=torch.backends.cuda.matmul.allow_tf32)
    return CPU_REFERENCE_PEAK[matmul_dtype(mode)]


COMPILE_SCOPES = {None: (), "blocks": ("blocks",), "model": ("model",), "both": ("blocks", "model")}  # --compile


def timed(step, x, y, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step(x, y)
    return (time.perf_counter() - t) / n


def tokens_per_s(mode: str, mcfg, args, x, y) -> dict[str, float]:
    """Median tokens/s at ``mode`` of our step, transformers' and (``--compile``) our step with compiled
    blocks and/or the compiled whole model, over alternating rounds (compilation happens in the warm-up steps)."""
    steps = {"ours": ours_step_fn(mcfg, mode, args.batch), "transformers": hf_step_fn(mcfg, mode)}
    for scope in COMPILE_SCOPES[args.compile]:
        steps[f"compiled {scope}"] = ours_step_fn(mcfg, mode, args.batch, compile=scope)
    for step in steps.values():
        timed(step, x, y, 2)  # warm-up: the second step runs what the first compiled
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(timed(step, x, y, args.steps))
    return {name: args.batch * args.seq_len / statistics.median(t) for name, t in times.items()}


# Operator groups of a CPU profile (regular expressions over torch.profiler's operator names, first match).
PROFILE_GROUPS = [
    ("matmuls (linear, mm, bmm)", r"aten::(mm|addmm|bmm|baddbmm|matmul|linear|_weight_int|mkldnn)"),
    ("attention (SDPA kernels)", r"scaled_dot_product|flash_attention|_efficient_attention|_sdpa"),
    ("optimizer (AdamW, grad norm, clip)", r"adam|_foreach|norm_backward_dummy|aten::(norm|linalg_vector_norm)"),
    ("loss (chunked cross entropy)", r"log_softmax|logsumexp|nll_loss|cross_entropy|aten::(exp|sub|gather|scatter)"),
    ("LayerNorm, GELU, softmax", r"layer_norm|gelu|softmax"),
    ("casts and copies", r"aten::(copy_|_to_copy|to|clone|contiguous|cat|stack|t|transpose|view|reshape|as_strided)$"),
    (
        "elementwise (add, mul, dropout, ...)",
        r"aten::(add|add_|mul|mul_|div|div_|where|masked_fill|zero_|fill_|sum|mean)",
    ),
]

# Kinds of GPU kernel (regular expressions over kernel names, case-insensitive, first match): NCCL's
# kernels before the reductions (AllReduce), flash and memory-efficient attention before gemm (their
# names say cutlass too), the optimizer's multi-tensor kernels before the reductions (the grad norm's
# LpNorm), cuBLAS's gemms (nvjet on Hopper, xmma, cutlass) before the reductions (its splitKreduce),
# inductor's templates / reductions / pointwise kernels by their prefixes; the rest is "other".
KERNEL_KINDS = [
    ("memcpy", r"^mem(cpy|set)\b"),
    ("communication", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa"),
    ("optimizer", r"adam|multi_tensor_apply|foreach|lamb"),
    ("gemm", r"gemm|gemv|nvjet|xmma|cutlass|cublas|triton_tem_"),
    (
        "reduction",
        r"reduce|softmax|layer_?norm|rms_?norm|nll_loss|logsumexp|cross_entropy|welford|cub::|"
        r"triton_(red|per)_",
    ),
    (
        "elementwise / cast",
        r"elementwise|vectorized|unrolled|copy|cast|fill|catarray|index|gather|scatter|embedding|"
        r"gelu|dropout|triton_poi_",
    ),
]


class EventRow(NamedTuple):
    """One row of ``prof.events()``: a CPU operator's, or a kernel's (or memcpy's) on the device."""

    name: str
    on_device: bool  # a kernel, memcpy or memset on the GPU's timeline (not a user annotation mirrored there)
    start_us: float
    end_us: float


def kernel_kind(name: str) -> str:
    return next((kind for kind, rx in KERNEL_KINDS if re.search(rx, name, re.IGNORECASE)), "other")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Time covered by at least one interval: kernels of two streams that overlap count once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def device_profile(rows: Iterable[EventRow], wall_us: float, *, top: int = 12) -> dict:
    """Device-only accounting of profiled steps that took ``wall_us``: kernel time per kind, the top
    kernels, and the GPU's idle share of the wall time (1 - busy / wall). CPU operator rows are left
    out: their self device time is their kernels' time again (counting both counted every kernel
    twice, and the kernel rows fell into "other")."""
    kernels = [r for r in rows if r.on_device]
    kinds = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    by_name: dict[str, float] = {}
    for r in kernels:
        kinds[kernel_kind(r.name)] += r.end_us - r.start_us
        by_name[r.name] = by_name.get(r.name, 0.0) + r.end_us - r.start_us
    busy = busy_us([(r.start_us, r.end_us) for r in kernels])
    return {
        "kernel_us": sum(kinds.values()),
        "busy_us": busy,
        "wall_us": wall_us,
        "idle_share": max(0.0, 1.0 - busy / wall_us) if wall_us > 0 else None,
        "kinds_us": kinds,
        "top_us": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:top]),
    }


def cpu_profile(ops: Iterable[tuple[str, float]], *, top: int = 12) -> dict:
    """CPU self time per operator group of ``(operator, self us)`` rows (self times: no overlap)."""
    ops = list(ops)
    groups = {name: 0.0 for name, _ in PROFILE_GROUPS} | {"other": 0.0}
    for key, t in ops:
        groups[next((n for n, rx in PROFILE_GROUPS if re.search(rx, key)), "other")] += t
    return {
        "self_us": sum(groups.values()),
        "kinds_us": groups,
        "top_us": dict(sorted(ops, key=lambda kv: -kv[1])[:top]),
    }


def profile_step(mode: str, mcfg, args, x, y, steps: int = 3) -> dict:
    """torch.profiler over ``steps`` of our step after one warm-up; prints where the time goes and
    returns it. On a GPU: kernel time per kind and the GPU's idle share (:func:`device_profile`); on
    the CPU: CPU self time per operator group (:func:`cpu_profile`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step = ours_step_fn(mcfg, mode, args.batch)
    step(x, y)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step(x, y)  # ends in loss.item(): the device is done when it returns
        wall_us = (time.perf_counter() - t0) * 1e6
    if DEVICE == "cuda":
        out = device_profile(
            [
                EventRow(
                    e.name,
                    e.device_type == DeviceType.CUDA and not e.is_user_annotation,
                    e.time_range.start,
                    e.time_range.end,
                )
                for e in prof.events()
            ],
            wall_us,
        )
        total, what = out["kernel_us"], "GPU kernel time"
        extra = f"; GPU busy {out['busy_us'] / wall_us:.1%} of the wall time, idle {out['idle_share']:.1%}"
    else:
        out = cpu_profile((e.key, e.self_cpu_time_total) for e in prof.key_averages())
        total, what, extra = out["self_us"], "CPU self time", ""
    out |= {"device": DEVICE, "steps": steps, "wall_s_per_step": wall_us / 1e6 / steps}
    total = total or 1
    print(
        f"\nwhere our {mode} step's time goes ({steps} profiled steps, {wall_us / 1e6 / steps:.3f} s per step; "
        f"{what} {total / 1e6 / steps:.3f} s per step{extra}):\n"
    )
    print("| group | share | s per step |\n|---|---|---|")
    for name, t in sorted(out["kinds_us"].items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {t / total:.1%} | {t / 1e6 / steps:.3f} |")
    print(f"\n| top {'kernels' if DEVICE == 'cuda' else 'operators'} | share |\n|---|---|")
    for key, t in out["top_us"].items():
        print(f"| `{key[:120]}` | {t / total:.1%} |")
    return out


def compare(mcfg, flops_per_token: float, args, x, y, report: dict) -> None:
    """The table: our step's tokens/s and MFU beside transformers', per mode, into ``report["rows"]``."""
    peaks = {
        dtype: measure_matmul_peak(dtype, DEVICE, sizes=PEAK_SIZES[DEVICE], repeats=5, budget_s=args.peak_budget_s)
        for dtype in DTYPE_NAMES
    }
    print(
        f"GPT-2 config: {mcfg.n_layer} layers, d_model {mcfg.d_model}, {mcfg.n_head} heads, vocab {mcfg.vocab_size}; "
        f"batch {args.batch} x seq {args.seq_len}; {report['device']}"
    )
    print(
        f"measured matmul peak (best of n = {', '.join(map(str, PEAK_SIZES[DEVICE]))} -- the sizes that fit in "
        f"{args.peak_budget_s:.0f} s --, 5 repeats each): "
        + ", ".join(
            f"{name} {peaks[d].flops / 1e9:,.0f} GFLOP/s (n={peaks[d].size})" for d, name in DTYPE_NAMES.items()
        )
    )
    print(
        "reference peak: "
        + ", ".join(
            f"{name} {reference_peak(name) / 1e9:,.0f} GFLOP/s" if reference_peak(name) else f"{name} unknown"
            for name in DTYPE_NAMES.values()
        )
        + "\n"
    )
    report["measured_peak_tflops"] = {DTYPE_NAMES[d]: p.flops / 1e12 for d, p in peaks.items()}
    print(
        "| dtype | glm-dist tokens/s | transformers tokens/s | ratio | MFU glm-dist | MFU transformers "
        "| MFU glm-dist (reference peak) | MFU transformers (reference peak) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        rates = tokens_per_s(mode, mcfg, args, x, y)
        measured, reference = peaks[matmul_dtype(mode)].flops, reference_peak(mode)
        peer = "autocast" if mode != "fp32" else "fp32"
        theirs = rates["transformers"]
        for name, label in (
            ("ours", f"{mode} (peer: {peer})"),
            *((f"compiled {scope}", f"{mode}, compiled {scope} (peer: {peer})") for scope in ("blocks", "model")),
        ):
            if name not in rates:
                continue
            ours = rates[name]
            mfu = {
                f"mfu_{who}_{which}": flops_per_token * tps / peak if peak else None
                for which, peak in (("measured", measured), ("reference", reference))
                for who, tps in (("ours", ours), ("transformers", theirs))
            }
            report["rows"][label] = {
                "tokens_per_s": ours,
                "transformers_tokens_per_s": theirs,
                "ratio": ours / theirs,
                **mfu,
            }
            cells = [f"{v:.1%}" if v is not None else "n/a" for v in mfu.values()]
            print(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | {' | '.join(cells)} |")
        for scope in COMPILE_SCOPES[args.compile]:
            ratio = rates[f"compiled {scope}"] / rates["ours"]
            print(f"|   compiled {scope} / eager ({mode}) | | | {ratio:.2f}x | | | | |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds per dtype")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round")
    ap.add_argument("--modes", default="fp32,bf16,bf16-autocast")
    ap.add_argument(
        "--profile", action="store_true", help="then profile our step at each mode and print where its time goes"
    )
    ap.add_argument(
        "--profile-only",
        action="store_true",
        help="only the profile of our step at each mode: no comparison, no peak measurement",
    )
    ap.add_argument(
        "--peak-budget-s",
        type=float,
        default=PEAK_BUDGET_S,
        help="seconds the matmul peak measurement may take (the sizes that fit)",
    )
    ap.add_argument("--json", help="also write the table's rows and the profile to this JSON file")
    ap.add_argument(
        "--compile",
        nargs="?",
        const="blocks",
        choices=[c for c in COMPILE_SCOPES if c],
        help="also time our step compiled with inductor: blocks (train.compile=blocks; --compile alone), "
        "model (train.compile=model: the whole forward with its loss) or both: a row per scope and mode",
    )
    args = ap.parse_args()

    init_distributed()
    torch.manual_seed(0)
    mcfg = gpt_config(
        "gpt2-small",
        n_layer=args.n_layer,
        d_model=args.d_model,
        n_head=args.n_head,
        context_length=max(args.seq_len, 1024),
    )
    with torch.device("meta"):
        flops_per_token = GPT(mcfg).num_flops_per_token(args.seq_len)
    x = torch.randint(0, mcfg.vocab_size, (args.batch, args.seq_len), device=DEVICE)
    y = torch.randint(0, mcfg.vocab_size, (args.batch, args.seq_len), device=DEVICE)
    where = torch.cuda.get_device_name() if DEVICE == "cuda" else f"CPU threads {torch.get_num_threads()}"
    report = {
        "device": where,
        "n_layer": mcfg.n_layer,
        "d_model": mcfg.d_model,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "rows": {},
        "profile": {},
    }
    if not args.profile_only:
        compare(mcfg, flops_per_token, args, x, y, report)
    if args.profile or args.profile_only:
        for mode in args.modes.split(","):
            report["profile"][mode] = profile_step(mode, mcfg, args, x, y)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
