"""Loader throughput: tokens/s delivered per objective with 0, 1 and 2 worker processes, beside
the tokens/s a training step consumes (tiny and GPT-2 small, measured in the same run), and MLM
masking beside transformers' DataCollatorForLanguageModeling on the same sequences.

    python bench/loader_throughput.py            # builds shards of the embedded corpus under /tmp if needed
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from data_pipeline.tokenize.prepare import prepare_shards
from glm_dist.data.loader import Loader
from glm_dist.data.workers import WorkerLoader
from glm_dist.objectives.mlm import MaskingOptions, mask_tokens

PROFILE_FOR = {
    "clm": "gpt2",
    "mlm": "roberta",
    "mlm_nsp": "bert",
    "sop": "albert",
    "span_corruption": "t5",
    "denoising": "roberta",
    "electra": "bert",
    "plm": "xlnet",
}


def shards_for(profile: str, root: str) -> str:
    out = f"{root}/{profile}"
    prepare_shards(source="embedded", out_dir=out, profile=profile, vocab_size=8192, shard_max_bytes=1 << 20)
    return out


def loader_tokens_per_s(
    shards_dir: str, objective: str, workers: int, *, seq_len: int, batch: int, seconds: float
) -> float:
    kw = dict(objective=objective, seq_len=seq_len, micro_batch_size=batch, seed=0)
    ld = WorkerLoader(shards_dir, num_workers=workers, **kw) if workers else Loader(shards_dir, **kw)
    ld.next_step()  # start-up (workers, first shard) is not throughput
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += ld.next_step()[0]["input_ids"].numel()
    return tokens / (time.perf_counter() - start)


def train_tokens_per_s(flavor: str, *, n_layer: int | None, seq_len: int, batch: int, steps: int = 3) -> float:
    """A bf16 forward/backward/AdamW step of our model on this machine (no DeepSpeed: an upper
    bound on consumption, which is what the loader must keep up with)."""
    from glm_dist.families.gpt.model import GPT, gpt_config
    from glm_dist.train.optim import build_optimizer
    from glm_dist.config.schema import TrainConfig

    model = GPT(gpt_config(flavor, n_layer=n_layer, context_length=max(seq_len, 256))).to(torch.bfloat16)
    opt = build_optimizer(model, TrainConfig())
    x = torch.randint(0, model.cfg.vocab_size, (batch, seq_len))
    for i in range(steps + 1):
        if i == 1:
            start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return batch * seq_len * steps / (time.perf_counter() - start)


def masking_vs_transformers(shards_dir: str, *, seq_len: int, batch: int, rounds: int) -> tuple[float, float]:
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_file=f"{shards_dir}/tokenizer.json",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )
    ld = Loader(shards_dir, objective="clm", seq_len=seq_len, micro_batch_size=batch, seed=0)
    seqs = [ld.next_step()[0]["input_ids"] for _ in range(rounds)]
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
    specials = np.arange(5)
    start = time.perf_counter()
    for s in seqs:  # the collator pads, builds special-token masks and masks the batch
        collator([{"input_ids": row} for row in s.tolist()])
    t_hf = time.perf_counter() - start
    rng, cfg = np.random.default_rng(0), MaskingOptions()
    start = time.perf_counter()
    for s in seqs:  # ours: per sequence, exact 15%, plus stacking into tensors
        rows = [mask_tokens(row, rng, cfg=cfg, mask_id=4, vocab_size=8192, special_ids=specials) for row in s.numpy()]
        torch.from_numpy(np.stack([r[0] for r in rows])), torch.from_numpy(np.stack([r[1] for r in rows]))
    t_ours = time.perf_counter() - start
    tokens = rounds * batch * seq_len
    return tokens / t_ours, tokens / t_hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/glm-bench-shards")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--objectives", default=",".join(PROFILE_FOR))
    args = ap.parse_args()

    consume = {
        "tiny (2.1M)": train_tokens_per_s("tiny", n_layer=None, seq_len=256, batch=16),
        "gpt2-small (124M)": train_tokens_per_s("gpt2-small", n_layer=None, seq_len=args.seq_len, batch=4),
    }
    print(
        "training step consumption on this machine (bf16, tokens/s): "
        + ", ".join(f"{k}: {v:,.0f}" for k, v in consume.items())
    )
    fastest_step = max(consume.values())
    print("\n| objective | 0 workers | 1 worker | 2 workers | best ÷ tiny step's consumption |")
    print("|---|---|---|---|---|")
    for objective in args.objectives.split(","):
        d = shards_for(PROFILE_FOR[objective], args.root)
        rates = [
            loader_tokens_per_s(d, objective, w, seq_len=args.seq_len, batch=args.batch, seconds=args.seconds)
            for w in (0, 1, 2)
        ]
        print(
            f"| {objective} | {rates[0]:,.0f} | {rates[1]:,.0f} | {rates[2]:,.0f} | {max(rates) / fastest_step:.0f}x |"
        )
    ours, hf = masking_vs_transformers(
        shards_for("roberta", args.root), seq_len=args.seq_len, batch=args.batch, rounds=40
    )
    print(
        f"\nMLM masking, tokens/s: glm-dist {ours:,.0f} | transformers DataCollatorForLanguageModeling {hf:,.0f} "
        f"| ratio {ours / hf:.2f}x"
    )


if __name__ == "__main__":
    main()
