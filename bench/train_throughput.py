"""Training-step throughput: glm-dist's trainer vs transformers' GPT2LMHeadModel + torch AdamW.

Same GPT-2 config, batch, sequence length and dtype; steps alternate between the two in one
run (timings on a shared machine drift; alternating keeps the comparison fair). Prints tokens/s,
the ratio, and model FLOPs utilisation against the matmul peak measured in the same run.

    python bench/train_throughput.py                 # GPT-2 small width, 4 layers, seq 256, batch 4
    python bench/train_throughput.py --n-layer 12 --rounds 3   # full GPT-2 small

On a GPU (picked automatically when CUDA is available; DeepSpeed then uses nccl) the same table is
the issue's MFU figure of a GPT-2 124M bf16 step against the GPU's measured matmul peak:

    python bench/train_throughput.py --n-layer 12 --seq-len 1024 --batch 16 --modes bf16
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch
import torch.nn.functional as F

from glm_dist.config.loader import load_config
from glm_dist.models.gpt import GPT, gpt_config
from glm_dist.observability.flops import measure_matmul_peak
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine
from glm_dist.train.optim import build_optimizer


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def ours_step_fn(cfg_model, precision: str, batch: int, lr: float = 1e-4):
    cfg = load_config(None, [f"train.precision={precision}", f"train.micro_batch_size={batch}",
                             "parallel.zero_stage=0", "train.grad_clip=1.0", f"train.lr={lr}"])
    model = GPT(cfg_model)
    engine = build_engine(model, build_optimizer(model, cfg.train), cfg, dp_size=1)
    ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if precision == "bf16-autocast" else contextlib.nullcontext()

    def step(x, y):
        with ctx:
            logits = engine(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
        engine.backward(loss)
        engine.step()
        return loss.item()

    return step


def hf_step_fn(cfg_model, precision: str, lr: float = 1e-4):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=cfg_model.vocab_size, n_positions=cfg_model.context_length,
                                       n_embd=cfg_model.d_model, n_layer=cfg_model.n_layer, n_head=cfg_model.n_head,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).to(DEVICE)
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


def timed(step, x, y, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        step(x, y)
    return (time.perf_counter() - t) / n


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
    args = ap.parse_args()

    init_distributed()
    torch.manual_seed(0)
    mcfg = gpt_config("gpt2-small", n_layer=args.n_layer, d_model=args.d_model, n_head=args.n_head,
                      context_length=max(args.seq_len, 1024))
    with torch.device("meta"):
        flops_per_token = GPT(mcfg).num_flops_per_token(args.seq_len)
    x = torch.randint(0, mcfg.vocab_size, (args.batch, args.seq_len), device=DEVICE)
    y = torch.randint(0, mcfg.vocab_size, (args.batch, args.seq_len), device=DEVICE)
    tokens = args.batch * args.seq_len
    n = 8192 if DEVICE == "cuda" else 2048
    peaks = {"fp32": measure_matmul_peak(torch.float32, n=n, device=DEVICE),
             "bf16": measure_matmul_peak(torch.bfloat16, n=n, device=DEVICE)}
    print(f"GPT-2 config: {mcfg.n_layer} layers, d_model {mcfg.d_model}, {mcfg.n_head} heads, vocab {mcfg.vocab_size}; "
          f"batch {args.batch} x seq {args.seq_len}; "
          + (torch.cuda.get_device_name() if DEVICE == "cuda" else f"CPU threads {torch.get_num_threads()}"))
    print(f"measured matmul peak: fp32 {peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s\n")
    rows = []
    for mode in args.modes.split(","):
        ours, hf = ours_step_fn(mcfg, mode, args.batch), hf_step_fn(mcfg, mode)
        timed(ours, x, y, 1), timed(hf, x, y, 1)  # warm-up
        t_ours, t_hf = [], []
        for _ in range(args.rounds):
            t_ours.append(timed(ours, x, y, args.steps))
            t_hf.append(timed(hf, x, y, args.steps))
        tps_ours, tps_hf = tokens / statistics.median(t_ours), tokens / statistics.median(t_hf)
        peak = peaks["fp32" if mode == "fp32" else "bf16"]
        rows.append((mode, tps_ours, tps_hf, tps_ours / tps_hf, flops_per_token * tps_ours / peak,
                     flops_per_token * tps_hf / peak))
        del ours, hf
    print("| dtype | glm-dist tokens/s | transformers tokens/s | ratio | MFU glm-dist | MFU transformers |")
    print("|---|---|---|---|---|---|")
    for mode, a, b, r, ma, mb in rows:
        peer = "autocast" if mode != "fp32" else "fp32"
        print(f"| {mode} (peer: {peer}) | {a:,.0f} | {b:,.0f} | {r:.2f}x | {ma:.1%} | {mb:.1%} |")


if __name__ == "__main__":
    main()
