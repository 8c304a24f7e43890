"""ULMFiT's ablations (Howard & Ruder 2018, tables 4-6 and figure 3) at tiny size on a real task:
WordNet supersense of a gloss (45 lexicographer files; data_pipeline/tasks/wordnet_gloss.py).

Stages, once each (seed 0), through the library's own paths:
1. general-domain LM: ``awd-lstm-tiny`` (32 -> 128 -> 128 -> 32) trained with ``glm train``'s Trainer on the
   embedded pydoc corpus (configs/experiments/awd-lstm-tiny-cpu.yaml), word tokenizer of 8192 words
   trained on that corpus plus the task's training glosses (unlabelled text; 31% of gloss tokens were
   <unk> with the pydoc-only vocabulary);
2. target-task LM: stage 1's weights (``train.init_from``) fine-tuned on the training glosses' text with
   discriminative (2.6) and slanted triangular rates (configs/experiments/ulmfit-target-lm-tiny-cpu.yaml);
3. the classifier (glm_dist/transfer/ulmfit.py: concat pooling, BPT3C, two linear blocks; dropouts the
   LM's x ``--drop-mult`` 0.2: 32-wide layers under 0.65 input dropout do not learn), per variant
   and seed (0, 1, 2): full ULMFiT (stage-2 LM, discriminative rates, STLR, gradual unfreezing), each
   trick removed (one rate for all / linear warmup-decay instead of STLR / everything trained from the
   first epoch), no target-task LM fine-tuning (stage-1 LM), and from scratch (a randomly initialised
   AWD-LSTM, STLR only).

The labelled pool is a fixed hash-chosen sample of the task's training split (``--pool`` glosses: the
CPU budget; the task has 90,692); the sample-efficiency curve trains on its first 1%, 10% and 100%
(full ULMFiT vs from scratch), each run at least ``--min-steps`` steps (more epochs for the small
fractions). Accuracy on a fixed sample of the test split; mean +- std over the seeds; a markdown table
on stdout and JSON in ``--out``.

    nice -n 10 python bench/ulmfit_ablation.py --out runs/ulmfit-ablation [--part 0/2 & --part 1/2]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from data_pipeline.tasks.wordnet_gloss import gloss_rows, majority_accuracy, sample
from data_pipeline.tokenize.profiles import special_ids, train_tokenizer
from glm_dist.config.loader import load_config
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.awd_lstm.model import AwdLstm
from glm_dist.families.registry import model_config_from_dict
from glm_dist.parallel.distributed import init_distributed
from glm_dist.transfer.options import FinetuneArgs
from glm_dist.train.loop import train
from glm_dist.transfer.tricks import Tricks
from glm_dist.transfer.ulmfit import ConcatPoolClassifier, accuracy, encode_documents, train_classifier

ROOT = Path(__file__).resolve().parents[1]
QUIET = [
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.eval_interval=0",
    "train.save_interval=0",
    "train.eval_batches=8",
]
FULL = dict(schedule="stlr", discriminative_lr=2.6, gradual_unfreezing=True)
VARIANTS = {  # name -> (LM stage, tricks)
    "full ULMFiT": ("target", FULL),
    "- discriminative lr": ("target", {**FULL, "discriminative_lr": 0.0}),
    "- STLR (linear warmup/decay)": ("target", {**FULL, "schedule": "linear"}),
    "- gradual unfreezing": ("target", {**FULL, "gradual_unfreezing": False}),
    "no target-task LM fine-tuning": ("general", FULL),
    "from scratch (no LM)": ("scratch", {"schedule": "stlr"}),
}


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def lm_stages(out: Path, train_rows: list[dict], *, steps1: int, steps2: int) -> dict[str, str]:
    """Stages 1 and 2 (skipped when their checkpoints exist); their checkpoint directories."""
    tok_path = out / "tokenizer.json"
    if not tok_path.exists():  # the general corpus's words and the task's (unlabelled) training text
        from data_pipeline.embedded import embedded_documents

        texts = [d["text"] for d in embedded_documents()] + [r["text"] for r in train_rows]
        train_tokenizer("word", texts, vocab_size=8192).save(str(tok_path))
    general, target = out / "general-lm", out / "target-lm"
    base = str(ROOT / "configs/experiments/awd-lstm-tiny-cpu.yaml")
    stage1 = general / f"checkpoints/step_{steps1:08d}"
    if not stage1.exists():
        train(
            load_config(
                base,
                [
                    *QUIET,
                    f"data.tokenizer={tok_path}",
                    f"data.shards_dir={out}/shards-general",
                    f"train.out_dir={general}",
                    f"train.max_steps={steps1}",
                ],
            )
        )
    stage2 = target / f"checkpoints/step_{steps2:08d}"
    if not stage2.exists():
        text = write_jsonl(out / "lm.jsonl", [{"text": r["text"]} for r in train_rows])
        train(
            load_config(
                str(ROOT / "configs/experiments/ulmfit-target-lm-tiny-cpu.yaml"),
                [
                    *QUIET,
                    f"data.source={text}",
                    f"data.tokenizer={tok_path}",
                    f"data.shards_dir={out}/shards-target",
                    f"train.out_dir={target}",
                    f"train.init_from={stage1}",
                    f"train.max_steps={steps2}",
                ],
            )
        )
    return {"general": str(stage1), "target": str(stage2)}


def run_classifier(
    ckpt: str,
    lm_kind: str,
    tricks_kw: dict,
    rows: list[dict],
    test: list[dict],
    labels: dict[str, int],
    *,
    seed: int,
    min_steps: int,
    batch: int,
    drop_mult: float,
) -> float:
    from tokenizers import Tokenizer

    lm, meta = load_checkpoint_model(ckpt)
    torch.manual_seed(seed)
    if lm_kind == "scratch":  # the same architecture, randomly initialised
        lm = AwdLstm(model_config_from_dict("awd-lstm", meta["model_config"]))
    tok = Tokenizer.from_file(str(Path(ckpt) / "tokenizer.json"))
    ids = special_ids(tok, "word")
    per_epoch = max(1, len(rows) // batch)
    args = FinetuneArgs(
        checkpoint=ckpt,
        train="-",
        lr=0.01,
        batch_size=batch,
        seed=seed,
        max_len=1400,
        epochs=max(5, math.ceil(min_steps / per_epoch)),
        **tricks_kw,
    )
    docs = encode_documents(rows, tok, args, labels, eos=ids["eos"])
    test_docs = encode_documents(test, tok, args, labels, eos=ids["eos"])
    model = ConcatPoolClassifier(lm.train(), len(labels), bptt=args.bptt, drop_mult=drop_mult)
    tricks = Tricks.from_args(args)
    groups = tricks.prepare(model, lm, model.head, weight_decay=0.01)
    train_classifier(model, tricks, groups, args, docs, None, pad_id=ids["pad"])
    return accuracy(model, *test_docs, 256, ids["pad"], "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/ulmfit-ablation")
    ap.add_argument("--pool", type=int, default=900, help="labelled training glosses that are '100%%'")
    ap.add_argument("--test", type=int, default=600, help="test glosses scored")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps1", type=int, default=300, help="stage-1 LM steps (16 x 70 tokens)")
    ap.add_argument("--steps2", type=int, default=150, help="stage-2 LM steps")
    ap.add_argument("--min-steps", type=int, default=50, help="classifier steps at least (small fractions)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--part", default="0/1", help="K/N: run every N-th classifier job from the K-th (N processes)")
    ap.add_argument("--drop-mult", type=float, default=0.2, help="the classifier's dropouts: the LM's times this")
    a = ap.parse_args()
    torch.set_num_threads(1)  # a loaded 2-core machine: more threads only contend
    init_distributed()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    splits = gloss_rows()
    pool, test = sample(splits["train"], a.pool), sample(splits["test"], a.test)
    labels = {name: i for i, name in enumerate(sorted({r["label"] for r in splits["train"]}))}
    t0 = time.time()
    ckpts = lm_stages(out, splits["train"], steps1=a.steps1, steps2=a.steps2)
    ckpts["scratch"] = ckpts["general"]  # (its tokenizer and model config; the weights are drawn anew)
    print(f"LM stages: {time.time() - t0:.0f} s", flush=True)
    part, parts = (int(x) for x in a.part.split("/"))
    mine = out / f"results-{part}-of-{parts}.json"
    results = json.loads(mine.read_text()) if mine.exists() else {}
    jobs = [(name, 1.0, seed) for name in VARIANTS for seed in range(a.seeds)] + [
        (name, f, seed)
        for f in (0.01, 0.1)
        for name in ("full ULMFiT", "from scratch (no LM)")
        for seed in range(a.seeds)
    ]
    for name, frac, seed in jobs[part::parts]:
        key = f"{name}|{frac}|{seed}"
        if key not in results:
            lm_kind, kw = VARIANTS[name]
            t = time.time()
            results[key] = run_classifier(
                ckpts[lm_kind],
                lm_kind,
                kw,
                pool[: max(1, round(frac * len(pool)))],
                test,
                labels,
                seed=seed,
                min_steps=a.min_steps,
                batch=a.batch,
                drop_mult=a.drop_mult,
            )
            print(f"{key}: {results[key]:.4f} ({time.time() - t:.0f} s)", flush=True)
            mine.write_text(json.dumps(results, indent=1))
    every = {k: v for f in out.glob(f"results-*-of-{parts}.json") for k, v in json.loads(f.read_text()).items()}
    if len(every) == len(jobs):  # the last part to finish prints the tables
        report(every, a, majority_accuracy(pool, test), seeds=a.seeds)


def _cell(results: dict, name: str, frac: float, seeds: int) -> str:
    scores = [100 * results[f"{name}|{frac}|{s}"] for s in range(seeds)]
    return f"{statistics.mean(scores):.1f} ± {statistics.stdev(scores):.1f}"


def report(results: dict, a, majority: float, *, seeds: int) -> None:
    print(
        f"\nWordNet gloss supersense (45 classes), {a.pool} labelled training glosses, {a.test} test glosses; "
        f"accuracy % (mean ± std over {seeds} seeds); majority class {100 * majority:.1f}\n"
    )
    print("| classifier | accuracy |\n|---|---|")
    for name in VARIANTS:
        print(f"| {name} | {_cell(results, name, 1.0, seeds)} |")
    print("\n| labelled glosses | full ULMFiT | from scratch |\n|---|---|---|")
    for frac in (0.01, 0.1, 1.0):
        n = max(1, round(frac * a.pool))
        print(
            f"| {frac:.0%} ({n}) | {_cell(results, 'full ULMFiT', frac, seeds)} | "
            f"{_cell(results, 'from scratch (no LM)', frac, seeds)} |"
        )


if __name__ == "__main__":
    main()
