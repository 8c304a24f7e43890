"""Cross-View Training against supervised-only training, at 50 / 200 / 1000 labelled sentences.

Task: BIO tags of the references to Python objects in Python's HTML documentation (python3-doc;
data_pipeline/tasks/pydoc_xref.py), held out by page, over the sentences that hold at least one
reference (three in four hold none: a tiny model's few hundred steps learn little but "O" from
those); the same unlabelled sentences (other pages, any sentence) for every run. Each run is
``glm train`` in this process (the Trainer: DeepSpeed engine, the alternating loader, validation
on the held-out sentences) from configs/experiments/cvt-tiny-cpu.yaml;
span-level F1 is the objective's validation figure (conlleval rules, as seqeval's default).

- supervised: ``objective.cvt_unlabelled=false``, S labelled steps;
- CVT: 2 S steps, labelled and unlabelled in turn (the same S labelled minibatches);
- multi-task CVT (at ``--multitask-size``): + WordNet part-of-speech tagging of the lemma in each
  example sentence (all its labelled examples), 4 S steps so the reference task still gets S
  labelled minibatches on average;
- lexicon: tag every word sequence that was a reference in the labelled sentences with its most
  frequent role (longest match first).

Each configuration runs with seeds 0, 1, 2 (the labelled sentences drawn, the initialisation and the
data order all change), ``--jobs`` runs at a time in worker processes. Results: a JSON file and a
markdown table on stdout.

    nice -n 10 python bench/cvt_curve.py --out runs/cvt-curve
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from data_pipeline.tasks.tagging_shards import (  # noqa: E402
    UNLABELLED_SEED,
    TaggingTask,
    subset,
    wordnet_task,
    write_tagging_shards,
    xref_task,
)

CONFIG = ROOT / "configs/experiments/cvt-tiny-cpu.yaml"


def lexicon_f1(labelled, test) -> float:
    """Span F1 (seqeval) of tagging each test word sequence that was a reference in ``labelled``
    with its most frequent role there, longest known sequence first."""
    from seqeval.metrics import f1_score

    roles: dict[tuple, Counter] = defaultdict(Counter)
    for s in labelled:
        start = None
        for i, tag in enumerate([*s.tags, "O"]):
            if start is not None and not tag.startswith("I-"):
                roles[s.words[start:i]][s.tags[start][2:]] += 1
                start = None
            if tag.startswith("B-"):
                start = i
    known = {words: c.most_common(1)[0][0] for words, c in roles.items()}
    longest = max(map(len, known), default=0)
    predicted = []
    for s in test:
        tags, i = ["O"] * len(s.words), 0
        while i < len(s.words):
            for n in range(min(longest, len(s.words) - i), 0, -1):
                role = known.get(s.words[i : i + n])
                if role:
                    tags[i : i + n] = [f"B-{role}"] + [f"I-{role}"] * (n - 1)
                    i += n - 1
                    break
            i += 1
        predicted.append(tags)
    return f1_score([list(s.tags) for s in test], predicted)


def train(job: dict) -> dict:
    """One ``glm train`` run in this (worker) process: its F1 and time."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from glm_dist.config.loader import load_config
    from glm_dist.train.loop import Trainer

    cfg = load_config(
        CONFIG,
        [
            f"data.shards_dir={job['shards']}",
            f"train.out_dir={job['out']}",
            f"train.seed={job['seed']}",
            f"train.max_steps={job['steps']}",
            f"model.tags={job['tags']}",
            f"objective.cvt_unlabelled={job['unlabelled']}",
            f"model.flavor={job['flavor']}",
            f"train.micro_batch_size={job['batch']}",
            "train.eval_interval=0",
            "train.save_interval=0",
            "train.eval_batches=1000",
            "train.plot=false",
            "logging.wandb=false",
            "logging.progress=false",
        ],
    )
    t0 = time.perf_counter()
    summary = Trainer(cfg).fit()
    r = {
        "key": job["key"],
        "f1": summary["val_f1"],
        "f1_task1": summary.get("val_f1_task1"),
        "seconds": time.perf_counter() - t0,
    }
    print(
        f"{job['key']} seed {job['seed']}: F1 {r['f1']:.4f}"
        + (f", WordNet F1 {r['f1_task1']:.4f}" if r["f1_task1"] is not None else "")
        + f" ({r['seconds']:.0f} s)",
        flush=True,
    )
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/cvt-curve")
    ap.add_argument("--sizes", default="50,200,1000")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=100, help="labelled steps S per run")
    ap.add_argument("--unlabelled", type=int, default=4000, help="unlabelled sentences (the same for every run)")
    ap.add_argument("--test", type=int, default=400, help="held-out sentences scored")
    ap.add_argument("--multitask-size", type=int, default=200)
    ap.add_argument("--flavor", default="cvt-tiny-words")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--jobs", type=int, default=3, help="runs trained at once (worker processes)")
    args = ap.parse_args()
    out = Path(args.out)
    sizes, seeds = [int(x) for x in args.sizes.split(",")], [int(x) for x in args.seeds.split(",")]
    t0 = time.perf_counter()
    xref, unlabelled_text = xref_task()
    refs = lambda rows: [s for s in rows if any(t != "O" for t in s.tags)]  # noqa: E731
    xref = TaggingTask(xref.name, xref.tags, refs(xref.labelled), subset(refs(xref.test), args.test, UNLABELLED_SEED))
    unlabelled_text = subset(unlabelled_text, args.unlabelled, UNLABELLED_SEED)
    wordnet = wordnet_task()
    wordnet = TaggingTask(
        wordnet.name, wordnet.tags, wordnet.labelled, subset(wordnet.test, args.test, UNLABELLED_SEED)
    )
    results: dict[str, list] = defaultdict(list)
    common = dict(flavor=args.flavor, batch=args.batch)
    jobs = []
    for size in sizes:
        for seed in seeds:
            shards = str(out / f"shards-{size}-{seed}")
            write_tagging_shards(
                shards, [xref], unlabelled_text, labelled_limit=size, subset_seed=seed, vocab_size=args.vocab
            )
            results[f"lexicon/{size}"].append({"f1": lexicon_f1(subset(xref.labelled, size, seed), xref.test)})
            for name, unl, steps in (("supervised", False, args.steps), ("cvt", True, 2 * args.steps)):
                jobs.append(
                    dict(
                        key=f"{name}/{size}",
                        shards=shards,
                        out=str(out / f"{name}-{size}-{seed}"),
                        seed=seed,
                        steps=steps,
                        tags=[len(xref.tags)],
                        unlabelled=unl,
                        **common,
                    )
                )
            if size == args.multitask_size:
                shards = str(out / f"shards-multi-{size}-{seed}")
                write_tagging_shards(
                    shards,
                    [xref, wordnet],
                    unlabelled_text,
                    labelled_limit=[size, None],
                    subset_seed=seed,
                    vocab_size=args.vocab,
                )
                jobs.append(
                    dict(
                        key=f"cvt-multitask/{size}",
                        shards=shards,
                        out=str(out / f"multitask-{size}-{seed}"),
                        seed=seed,
                        steps=4 * args.steps,
                        tags=[len(xref.tags), len(wordnet.tags)],
                        unlabelled=True,
                        **common,
                    )
                )
    jobs.sort(key=lambda j: -j["steps"])  # the longest first: the workers finish together
    with multiprocessing.get_context("spawn").Pool(args.jobs, maxtasksperchild=1) as pool:
        for r in pool.imap_unordered(train, jobs):
            results[r.pop("key")].append(r)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(
        f"\n{len(xref.test)} held-out sentences, {len(unlabelled_text)} unlabelled; "
        f"{time.perf_counter() - t0:.0f} s in all\n"
    )
    print("| method | " + " | ".join(f"{s} labelled" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for method in ("lexicon", "supervised", "cvt", "cvt-multitask"):
        cells = []
        for size in sizes:
            f1 = [r["f1"] for r in results.get(f"{method}/{size}", [])]
            cells.append(f"{statistics.mean(f1):.3f} ± {statistics.stdev(f1) if len(f1) > 1 else 0:.3f}" if f1 else "")
        print(f"| {method} | " + " | ".join(cells) + " |")
    wn = [r["f1_task1"] for r in results.get(f"cvt-multitask/{args.multitask_size}", [])]
    if wn:
        print(
            f"\nWordNet part-of-speech F1 of the multi-task runs: {statistics.mean(wn):.3f} ± "
            f"{statistics.stdev(wn) if len(wn) > 1 else 0:.3f}"
        )


if __name__ == "__main__":
    main()
