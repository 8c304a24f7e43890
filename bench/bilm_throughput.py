"""Training-step throughput of ELMo's biLM beside a GPT of the same parameter count, in one run.

Both steps are our trainer's: the DeepSpeed engine (ZeRO-0, fp32, clipping, AdamW) and the family's
objective loss (``bilm``: both directions' NLL; ``clm``), the same batch of windows of the same
word-level vocabulary, alternating round by round (timings on a shared machine drift). The GPT's
width is chosen so that its parameters match the biLM's (softmax included in both). Prints tokens/s,
the model FLOPs per token (``num_flops_per_token``) and the achieved GFLOP/s of each.

    python bench/bilm_throughput.py                                   # elmo-tiny (char CNN), seq 20, batch 32
    python bench/bilm_throughput.py --flavor elmo-tiny-words --seq-len 64 --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from data_pipeline.tokenize.word import char_table
from glm_dist.config.loader import load_config
from glm_dist.families.elmo.model import ELMo, elmo_config
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.objectives.bilm import BILM
from glm_dist.objectives.clm import CLM
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine
from glm_dist.train.optim import build_optimizer


def engine_of(model: torch.nn.Module, batch: int):
    cfg = load_config(
        None,
        [
            "train.precision=fp32",
            f"train.micro_batch_size={batch}",
            "parallel.zero_stage=0",
            "train.grad_clip=1.0",
            "train.lr=1e-3",
        ],
    )
    return build_engine(model, build_optimizer(model, cfg.train), cfg, dp_size=1)


def step_fn(engine, objective, batch: dict):
    def step() -> float:
        loss, _ = objective.loss(engine, batch, metrics=False)
        engine.backward(loss)
        engine.step()
        return loss.item()

    return step


def gpt_of_size(target: int, *, vocab: int, n_layer: int, n_head: int, context: int):
    """The GPT (``n_layer`` blocks, width a multiple of ``n_head``) whose parameter count is nearest ``target``."""

    def count(d: int) -> int:
        with torch.device("meta"):
            return sum(
                p.numel()
                for p in GPT(
                    gpt_config(
                        "gpt2-small",
                        vocab_size=vocab,
                        n_layer=n_layer,
                        d_model=d,
                        n_head=n_head,
                        context_length=context,
                    )
                ).parameters()
            )

    d = min(range(n_head, 2049, n_head), key=lambda w: abs(count(w) - target))
    return gpt_config("gpt2-small", vocab_size=vocab, n_layer=n_layer, d_model=d, n_head=n_head, context_length=context)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flavor", default="elmo-tiny")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--gpt-layers", type=int, default=2)
    ap.add_argument("--gpt-heads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    init_distributed()
    torch.manual_seed(0)
    bilm = ELMo(elmo_config(args.flavor, vocab_size=args.vocab))
    gcfg = gpt_of_size(
        bilm.num_params(),
        vocab=args.vocab,
        n_layer=args.gpt_layers,
        n_head=args.gpt_heads,
        context=max(args.seq_len, 64),
    )
    gpt = GPT(gcfg)
    rng = np.random.default_rng(0)
    window = torch.from_numpy(rng.integers(4, args.vocab, size=(args.batch, args.seq_len + 2)))
    chars = torch.from_numpy(char_table([f"w{i}" for i in range(args.vocab)], pad=0, bos=2, eos=3).astype(np.int64))
    ids = window[:, 1:-1]
    models = {
        f"ELMo biLM ({args.flavor}: {bilm.cfg.n_layer} x 2 LSTMP {bilm.cfg.d_lstm} -> {bilm.cfg.d_model}"
        f"{', char CNN' if bilm.cfg.char_cnn else ''})": (
            bilm,
            BILM,
            {
                "input_ids": ids,
                "char_ids": chars[ids],
                "forward_labels": window[:, 2:],
                "backward_labels": window[:, :-2],
            },
        ),
        f"GPT ({gcfg.n_layer} blocks, d_model {gcfg.d_model}, {gcfg.n_head} heads)": (
            gpt,
            CLM,
            {"input_ids": ids, "labels": window[:, 2:]},
        ),
    }
    steps = {
        name: step_fn(engine_of(model, args.batch), objective, batch)
        for name, (model, objective, batch) in models.items()
    }
    for step in steps.values():
        step()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            times[name].append((time.perf_counter() - t) / args.steps)
    print(
        f"batch {args.batch} x seq {args.seq_len}, vocab {args.vocab}, fp32, CPU threads {torch.get_num_threads()}; "
        f"median of {args.rounds} alternating rounds of {args.steps} steps\n"
    )
    print("| model | parameters | tokens/s | training FLOPs / token | GFLOP/s |\n|---|---|---|---|---|")
    for name, (model, _, _) in models.items():
        tps = args.batch * args.seq_len / statistics.median(times[name])
        flops = model.num_flops_per_token(args.seq_len)
        params = sum(p.numel() for p in model.parameters())
        print(f"| {name} | {params / 1e6:.2f}M | {tps:,.0f} | {flops / 1e6:.1f}M | {tps * flops / 1e9:.1f} |")


if __name__ == "__main__":
    main()
