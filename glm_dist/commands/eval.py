"""``glm eval``: validation loss, perplexity and bits per byte of a checkpoint (``-c``), or lm-eval tasks
(``--tasks``): their scores, their curve over shots and model sizes, or their scores split by contamination."""

from __future__ import annotations

import argparse

from glm_dist.commands.shared import config_args, in_range, names
from glm_dist.config.loader import load_config
from glm_dist.eval.run import main_eval

HELP = "validation loss / perplexity / bits per byte as JSON (-c), or lm-eval tasks (--tasks)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p, required=False)
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    p.add_argument("--tasks", help="comma-separated lm-eval tasks (zero/few-shot), instead of validation perplexity")
    p.add_argument("--include-path", help="a folder of task YAMLs (glm data eval-tasks --out DIR)")
    p.add_argument("--num-fewshot", type=int, help="examples in each prompt (default: the task's, usually 0)")
    p.add_argument("--limit", type=float, help="documents per task (a fraction if < 1)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default="lm_eval_results.json", help="where lm-eval's results JSON goes")
    p.add_argument(
        "--curve",
        help="--tasks: score vs k, e.g. k=0,1,5 (--checkpoint A,B,...: and vs model size); "
        "--out FILE.json gets the points, FILE_k.png and FILE_size.png the plots",
    )
    p.add_argument(
        "--contamination",
        help="--tasks: a crawl run's contamination.json; every score also on the "
        "clean and the dirty items (matched by id)",
    )
    p.add_argument(
        "--documents",
        type=int,
        default=32,
        help="-c, decoder-only LMs: score this many held-out "
        "documents whole (token-, word- and byte-level perplexity; 0: none)",
    )
    p.add_argument(
        "--stride",
        type=int,
        help="-c --documents: sliding windows of the context advance by this many "
        "tokens (default: the context, disjoint windows; GPT-2's LM benchmarks used overlapping ones)",
    )


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # bad overrides fail here, whichever evaluation follows
    if args.tasks:
        _tasks(args)
        return 0
    if not args.config:
        raise FileNotFoundError("glm eval needs -c CONFIG (validation perplexity) or --tasks T1,T2 (lm-eval)")
    in_range("--documents", args.documents, 0)  # was read as a slice: all documents but the last N
    main_eval(cfg, args.checkpoint, documents=args.documents, stride=args.stride)
    return 0


def _tasks(args: argparse.Namespace) -> None:
    """``--tasks``: lm-evaluation-harness scores, their curve (``--curve``) or their contamination split."""
    # lm-eval is an optional dependency (the test extra): glm eval -c runs without it
    from glm_dist.eval.contamination import run_contamination
    from glm_dist.eval.curve import parse_curve, run_curve
    from glm_dist.eval.harness import run_tasks

    tasks = names(args.tasks)
    if args.curve:
        curve = run_curve(
            names(args.checkpoint),
            tasks,
            parse_curve(args.curve),
            include_path=args.include_path,
            limit=args.limit,
            batch_size=args.batch_size,
            out=args.out,
        )
        if curve is not None:
            print(f"curve: {args.out} ({len(curve['points'])} points); plots: {', '.join(curve['plots'])}")
    elif args.contamination:
        run_contamination(
            args.checkpoint,
            tasks,
            contamination=args.contamination,
            include_path=args.include_path,
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            batch_size=args.batch_size,
            out=args.out,
        )
    else:
        run_tasks(
            args.checkpoint,
            tasks,
            include_path=args.include_path,
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            batch_size=args.batch_size,
            out=args.out,
        )
