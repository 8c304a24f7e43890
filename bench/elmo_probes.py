"""ELMo's two claims (Peters et al. 2018, sections 5.3 and 5.4) on a tiny biLM and WordNet's sentences.

1. Lower layers are more syntactic, higher ones more semantic: a linear probe of each layer (the
   token layer, LSTM 1, LSTM 2; each [forward; backward] at the word) on a word's part of speech
   in context (4 classes) and on its supersense among its part of speech's (nouns: 26 lexicographer
   files, verbs: 15), lemmas held out (a probe never sees a test word).
2. ELMo helps most when labelled data is small: the task model of ``glm_dist/transfer/elmo_task.py``
   (own word embeddings -> biLSTM -> the word's class) with and without ELMo at its input, trained on
   1%, 10% and 100% of the training split, on the word's supersense (45 classes), synsets held out.

Both over the items of ``data_pipeline/tasks/wordnet_context.py`` (every WordNet example sentence
whose lemma is found), mean ± std over seeds (each seed: another split, subset and initialisation;
one pretrained biLM). The biLM is ``elmo-tiny`` (character CNN) pretrained here on the embedded
corpus with ``glm train`` (``--steps``), or a checkpoint given with ``--checkpoint``.

    nice -n 10 python bench/elmo_probes.py                      # ~30 min on 2 CPU cores
    python bench/elmo_probes.py --checkpoint runs/x/checkpoints/step_00000400 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from data_pipeline import wordnet
from data_pipeline.tasks.wordnet_context import items, split
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.transfer.elmo import ElmoEmbedder, layer_features
from glm_dist.transfer.elmo_task import WordInContext, accuracy, fit, task_vocabulary
from glm_dist.transfer.probe import ProbeSplit, linear_probe, majority_accuracy

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/experiments/elmo-tiny-cpu.yaml"
POS = ("n", "v", "a", "r")
LAYER_NAMES = ("token layer", "LSTM 1", "LSTM 2")
PREFIX = {"n": "noun.", "v": "verb."}  # the semantic probe's parts of speech and their lexicographer files


def glm(*args: str) -> str:
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": str(torch.get_num_threads()),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"glm {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def pretrain(work: Path, steps: int) -> tuple[Path, dict]:
    """A tiny character-CNN biLM on the embedded corpus (bilm-tf's 20-token windows); its glm eval."""
    shards, run = work / "shards", work / "run"
    common = [f"data.shards_dir={shards}", "data.seq_len=20", "logging.wandb=false", "logging.progress=false"]
    if not (shards / "manifest.json").exists():
        glm("data", "tokenize", "-c", str(CONFIG), *common)
    ckpt = run / f"checkpoints/step_{steps:08d}"
    if not (ckpt / "meta.json").exists():  # a finished run in --work is reused
        glm(
            "train",
            "-c",
            str(CONFIG),
            *common,
            f"train.out_dir={run}",
            f"train.max_steps={steps}",
            "train.micro_batch_size=32",
            "train.eval_interval=0",
            f"train.save_interval={steps}",
            "train.plot=false",
            f"train.warmup_steps={max(1, steps // 20)}",
        )
    ev = glm("eval", "-c", str(CONFIG), *common, "train.eval_batches=16", "--documents", "0", "--checkpoint", str(ckpt))
    return ckpt, json.loads(ev[ev.index("{") :])


def features_of(ckpt: Path, rows: list[dict]) -> None:
    """Every row's biLM layers (L + 1, words, 2 d_model) as ``row["layers"]`` (float16), batched by length."""
    bilm, _ = load_checkpoint_model(ckpt)
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["words"]))
    for start in range(0, len(order), 2048):
        part = order[start : start + 2048]
        for i, f in zip(part, layer_features(bilm, tok, [rows[i]["words"] for i in part], batch_size=128)):
            rows[i]["layers"] = f.astype(np.float16)


def probe_splits(parts: dict[str, list[dict]], layer: int, task: str) -> tuple[dict[str, ProbeSplit], int]:
    """One layer's vectors at the word and the task's labels, per split; and the number of classes."""
    out = {}
    for name, rows in parts.items():
        if task == "pos":
            out[name] = ProbeSplit(
                np.stack([r["layers"][layer, r["position"]] for r in rows]).astype(np.float32),
                np.array([POS.index(r["pos"]) for r in rows]),
            )
            continue
        rows = [r for r in rows if r["pos"] in PREFIX]  # (adjectives: 3 files, 90% adj.all; adverbs: 1)
        allowed = np.array([[name.startswith(PREFIX[r["pos"]]) for name in wordnet.LEXNAMES] for r in rows])
        out[name] = ProbeSplit(
            np.stack([r["layers"][layer, r["position"]] for r in rows]).astype(np.float32),
            np.array([wordnet.LEXNAMES.index(r["supersense"]) for r in rows]),
            allowed,
        )
    return out, (len(POS) if task == "pos" else len(wordnet.LEXNAMES))


def run_probes(rows: list[dict], seeds: list[int], epochs: int) -> dict:
    results: dict = {}
    for seed in seeds:
        parts = split(rows, seed=seed, by="lemma")
        for task in ("pos", "supersense"):
            for layer in range(len(LAYER_NAMES)):
                data, classes = probe_splits(parts, layer, task)
                r = linear_probe(
                    data["train"], data["valid"], data["test"], num_classes=classes, seed=seed, epochs=epochs
                )
                results.setdefault(task, {}).setdefault(LAYER_NAMES[layer], []).append(r["test_accuracy"])
            baseline = majority_accuracy(data["train"], data["test"])
            results.setdefault(task, {}).setdefault("majority", []).append(baseline)
        print(
            f"  probes, seed {seed}: "
            + "; ".join(f"{t} " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in r.items()) for t, r in results.items()),
            flush=True,
        )
    return results


def run_curve(rows: list[dict], ckpt: Path, seeds: list[int], fractions: list[float], min_steps: int) -> dict:
    bilm, _ = load_checkpoint_model(ckpt)
    for r in rows:
        r["label"] = wordnet.LEXNAMES.index(r["supersense"])
    results: dict = {}
    for seed in seeds:
        parts = split(rows, seed=seed, by="synset")
        order = np.random.default_rng(seed).permutation(len(parts["train"]))
        for fraction in fractions:
            train = [parts["train"][i] for i in order[: max(1, round(fraction * len(order)))]]
            entry = results.setdefault(f"{fraction:.0%}", {"items": [], "majority": []})
            entry["items"].append(len(train))
            most = Counter(r["label"] for r in train).most_common(1)[0][0]
            entry["majority"].append(sum(r["label"] == most for r in parts["test"]) / len(parts["test"]))
            vocab = task_vocabulary(train)
            for with_elmo in (False, True):
                torch.manual_seed(seed)
                elmo = ElmoEmbedder(bilm) if with_elmo else None
                model = WordInContext(vocab_size=len(vocab) + 2, num_classes=len(wordnet.LEXNAMES), elmo=elmo)
                t = time.perf_counter()
                info = fit(model, train, parts["valid"], vocab, seed=seed, batch_size=64, min_steps=min_steps)
                score = accuracy(model, parts["test"], vocab)
                entry.setdefault("ELMo" if with_elmo else "baseline", []).append(score)
                print(
                    f"  curve seed {seed}, {fraction:.0%}, {'ELMo' if with_elmo else 'baseline'}: test {score:.3f} "
                    f"({info['epochs']} epochs, {time.perf_counter() - t:.0f}s)",
                    flush=True,
                )
    return results


def mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def print_probes(probes: dict, num_seeds: int) -> None:
    print(f"\nprobe accuracy on held-out lemmas, mean ± std over {num_seeds} seeds\n")
    print("| layer | POS (4 classes) | supersense within POS (nouns, verbs) |\n|---|---|---|")
    for layer in ("majority", *LAYER_NAMES):
        print(f"| {layer} | {mean_std(probes['pos'][layer])} | {mean_std(probes['supersense'][layer])} |")


def print_curve(curve: dict, num_seeds: int) -> None:
    print(f"\nsupersense (45 classes), test accuracy by training size, mean ± std over {num_seeds} seeds\n")
    print("| training set | items | majority class | baseline | + ELMo | gain |\n|---|---|---|---|---|---|")
    for key, r in curve.items():
        gain = [b - a for a, b in zip(r["baseline"], r["ELMo"])]
        print(
            f"| {key} | {statistics.mean(r['items']):,.0f} | {mean_std(r['majority'])} | {mean_std(r['baseline'])} "
            f"| {mean_std(r['ELMo'])} | {mean_std(gain)} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", help="an ELMo checkpoint to probe (default: pretrain elmo-tiny here)")
    ap.add_argument("--steps", type=int, default=300, help="pretraining steps (32 windows of 20 words)")
    ap.add_argument("--work", default="runs/elmo-probes", help="shards, run and results.json go here")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--probe-epochs", type=int, default=10)
    ap.add_argument("--experiments", default="probes,curve", help="which of the two to run")
    ap.add_argument("--fractions", default="0.01,0.1,1")
    ap.add_argument("--min-steps", type=int, default=600, help="task-model updates at least (fit's min_steps)")
    ap.add_argument("--every", type=int, default=1, help="use every n-th item only (a quick run)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (small recurrent kernels: on a busy 2-core machine one thread beats two)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.checkpoint:
        ckpt, ppl = Path(args.checkpoint), None
    else:
        ckpt, ppl = pretrain(work, args.steps)
        print(
            f"pretrained {ckpt}: perplexity forward {ppl['forward_perplexity']:.1f}, backward "
            f"{ppl['backward_perplexity']:.1f} ({time.perf_counter() - t0:.0f}s)",
            flush=True,
        )
    rows, counts = items()
    rows = rows[:: args.every]
    print(f"WordNet examples: {json.dumps(counts.as_dict())}", flush=True)
    features_of(ckpt, rows)
    print(f"features of {len(rows):,} sentences ({time.perf_counter() - t0:.0f}s)", flush=True)
    seeds, results = list(range(args.seeds)), {"checkpoint": str(ckpt), "perplexity": ppl, "counts": counts.as_dict()}
    if "probes" in args.experiments:
        results["probes"] = run_probes(rows, seeds, args.probe_epochs)
    if "curve" in args.experiments:
        results["curve"] = run_curve(rows, ckpt, seeds, [float(f) for f in args.fractions.split(",")], args.min_steps)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    if "probes" in results:
        print_probes(results["probes"], len(seeds))
    if "curve" in results:
        print_curve(results["curve"], len(seeds))
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
