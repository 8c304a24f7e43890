"""Cross-View Training for translation against supervised-only training, on the tiny CoVe model
(Clark et al. 2018, section 3.3): English -> German gettext pairs, ``--labelled`` of them with their
targets, the sources of all the other training pairs as unlabelled text.

- supervised: ``objective.cvt_unlabelled=false``, S labelled steps;
- CVT: 2 S steps, labelled and unlabelled minibatches in turn (the same S labelled minibatches):
  on an unlabelled one the primary decoder's beam translation (``model.cvt_beam``) is the target of
  the attention-dropout and future-word auxiliary decoders.

Both start from the same initialisation per seed and are scored by ``glm eval`` on the same held-out
pairs: the primary decoder's perplexity, greedy and beam BLEU (sacrebleu). Every run is ``glm train``
from configs/experiments/cvt-translation-tiny-cpu.yaml. Prints a markdown table (mean +- std over the
seeds) and writes the runs' figures as JSON.

Inputs (built as configs/experiments/cove-tiny-cpu.yaml says): ``--vectors`` GloVe text vectors
(``glm data vectors``), ``--pairs`` a pair folder (``glm data gettext``).

    python bench/cvt_translation.py --vectors data/glove-tiny.txt --pairs data/gettext-de --out runs/cvt-mt
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs/experiments/cvt-translation-tiny-cpu.yaml"
METRICS = ("perplexity", "bleu_greedy", "bleu_beam")


def glm(*args: str) -> dict:
    """``glm ARGS`` in a subprocess; its last JSON object."""
    env = {**os.environ, "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "glm_dist.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"glm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout[proc.stdout.rindex("\n{") + 1 if "\n{" in proc.stdout else proc.stdout.index("{") :])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vectors", required=True, help="GloVe text vectors (glm data vectors)")
    p.add_argument("--pairs", required=True, help="a pair folder (glm data gettext)")
    p.add_argument("--out", default="runs/cvt-translation")
    p.add_argument("--labelled", type=int, default=1000, help="training pairs that keep their target")
    p.add_argument("--steps", type=int, default=200, help="labelled steps of every run (S)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--beam", type=int, default=4, help="the teacher's beam (model.cvt_beam)")
    p.add_argument("--batch", type=int, default=64, help="pairs (or sources) per minibatch")
    p.add_argument("--eval-batches", type=int, default=8, help="held-out minibatches scored")
    args = p.parse_args()

    out = Path(args.out).resolve()
    shards = out / f"pairs-{args.labelled}"
    data = [
        f"data.source={Path(args.pairs).resolve()}",
        f"data.vectors={Path(args.vectors).resolve()}",
        f"data.shards_dir={shards}",
        f"data.labelled_pairs={args.labelled}",
    ]
    made = glm("data", "tokenize", "-c", str(CONFIG), *data)
    common = [
        *data,
        "logging.wandb=false",
        "logging.progress=false",
        "train.plot=false",
        "train.eval_interval=0",
        f"model.cvt_beam={args.beam}",
        f"train.eval_batches={args.eval_batches}",
        f"train.micro_batch_size={args.batch}",
    ]
    rows: dict[str, list[dict]] = {"supervised": [], "cvt": []}
    for seed in args.seeds:
        for method, unlabelled, steps in (("supervised", "false", args.steps), ("cvt", "true", 2 * args.steps)):
            run = out / f"{method}-seed{seed}"
            t0 = time.perf_counter()
            glm(
                "train",
                "-c",
                str(CONFIG),
                *common,
                f"objective.cvt_unlabelled={unlabelled}",
                f"train.seed={seed}",
                f"train.max_steps={steps}",
                f"train.save_interval={steps}",
                f"train.out_dir={run}",
                f"train.warmup_steps={steps // 10}",
            )  # the same schedule over the labelled steps of both
            metrics = glm(
                "eval", "-c", str(CONFIG), *common, "--checkpoint", str(run / f"checkpoints/step_{steps:08d}")
            )
            row = {
                "seed": seed,
                "steps": steps,
                "seconds": round(time.perf_counter() - t0, 1),
                **{k: metrics[k] for k in METRICS},
            }
            rows[method].append(row)
            print(json.dumps({method: row}), flush=True)
    (out / "results.json").write_text(json.dumps({"pair_set": made, "args": vars(args), "runs": rows}, indent=1))

    def cell(method: str, key: str) -> str:
        values = [r[key] for r in rows[method]]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {spread:.2f}"

    print(
        f"\n{args.labelled} labelled pairs, {made.get('unlabelled_sources')} unlabelled sources, "
        f"{args.steps} labelled steps of {args.batch}, teacher beam {args.beam}, seeds {args.seeds}\n"
    )
    print("| method | steps | held-out perplexity | BLEU greedy | BLEU beam |\n|---|---|---|---|---|")
    for method, label in (("supervised", "supervised only"), ("cvt", "CVT (+ unlabelled steps)")):
        print(f"| {label} | {rows[method][0]['steps']} | " + " | ".join(cell(method, k) for k in METRICS) + " |")


if __name__ == "__main__":
    main()
