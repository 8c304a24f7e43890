"""The ``glm`` command (stable names from ARCHITECTURE.md; run ``glm COMMAND --help``)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import typing
from pathlib import Path

from glm_dist.config.loader import ConfigError, load_config, to_dict


def _config_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("-c", "--config", required=required, help="YAML config file (with optional base:)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys, e.g. train.lr=3e-4")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glm", description="Pretrain generalized language models on DeepSpeed.")
    sub = parser.add_subparsers(dest="command", required=True)

    _config_args(sub.add_parser("train", help="train (one process, torchrun, deepspeed or srun)"))

    p = sub.add_parser("eval", help="validation loss / perplexity / bits per byte as JSON")
    _config_args(p)
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")

    p = sub.add_parser("export-hf", help="write a folder transformers' from_pretrained loads")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)

    p = sub.add_parser("config", help="inspect configs")
    csub = p.add_subparsers(dest="config_command", required=True)
    show = csub.add_parser("show", help="print the resolved config (or the DeepSpeed JSON)")
    _config_args(show, required=False)
    show.add_argument("--deepspeed", action="store_true", help="print the generated DeepSpeed JSON")
    show.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    csub.add_parser("keys", help="every config key with its type, default and help")

    p = sub.add_parser("data", help="data preparation")
    dsub = p.add_subparsers(dest="data_command", required=True)
    tok = dsub.add_parser("tokenize", help="train/load the tokenizer and write token shards")
    _config_args(tok)
    tok.add_argument("--task", type=int, help="run only this encoding task (one input file; SLURM array index)")
    tok.add_argument("--prepare-only", action="store_true",
                     help="only write the tokenizer and print the number of encoding tasks")
    run = dsub.add_parser("run", help="the crawl pipeline: read, extract, filter, dedup, decontaminate, write")
    run.add_argument("-c", "--config", required=True, help="a recipe, e.g. configs/data/fineweb.yaml")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. input=... output=... benchmarks=...")
    run.add_argument("--stage", help="run only this stage (all its tasks, or --task); for SLURM arrays")
    run.add_argument("--task", type=int, help="with --stage: run only this task")
    run.add_argument("--tasks", action="store_true", help="print each stage's task count as JSON and exit")
    clf = dsub.add_parser("train-classifier", help="train GPT-3's quality classifier (positives: curated text, negatives: crawl)")
    clf.add_argument("--positive", nargs="+", required=True, help="curated text: JSONL/Parquet/text/WARC paths or globs")
    clf.add_argument("--negative", nargs="+", required=True, help="raw crawl: JSONL/Parquet/text/WARC paths or globs")
    clf.add_argument("--out", required=True, help="model file (.npz) for the recipe's classifier.model")
    clf.add_argument("--text-field", default="text")
    clf.add_argument("--max-docs", type=int, default=100_000, help="per class")
    clf.add_argument("--l2", type=float, default=0.1, help="L2 penalty (smaller: more confident scores)")
    task = dsub.add_parser("docstring-task", help="write the built-in classification task (docstring -> module) as JSONL")
    task.add_argument("--out", required=True)

    p = sub.add_parser("finetune", help="sequence classification from an encoder checkpoint (JSONL/CSV)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train", required=True, help="JSONL or CSV rows with text (and text pair) and label")
    p.add_argument("--valid", help="held-out rows (default: 20%% of --train by row hash)")
    p.add_argument("--task", choices=["classify", "seq2seq"], default="classify",
                   help="classify: [CLS] + one matrix (encoders); seq2seq: text -> target text (t5, bart)")
    p.add_argument("--prefix", default="", help="seq2seq: a T5-style task prefix, e.g. 'summarize: '")
    p.add_argument("--text-field", default="text")
    p.add_argument("--pair-field", help="second text of a pair task (e.g. text_b)")
    p.add_argument("--label-field", default="label", help="the label (classify) or target text (seq2seq) field")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write finetune.json and the classifier weights here")

    p = sub.add_parser("plan", help="memory per GPU of every (DP, PP, TP, ZeRO, offload) layout, and the one to use")
    _config_args(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="GB per GPU (default 80)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--show", type=int, default=20, help="layouts listed")
    p.add_argument("--json", action="store_true", help="all layouts as JSON")

    sub.add_parser("launch", help="torchrun with defaults (see glm launch --help)")
    sub.add_parser("slurm", help="glm slurm submit -c CONFIG --nodes N ... (see glm slurm submit --help)")
    return parser


def _print_keys() -> None:
    from glm_dist.config.schema import Config

    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        sec_cls = hints[section.name]
        sec_hints = typing.get_type_hints(sec_cls)
        for f in dataclasses.fields(sec_cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            typ = getattr(sec_hints[f.name], "__name__", str(sec_hints[f.name]).replace("typing.", ""))
            print(f"{section.name}.{f.name}: {typ} = {default!r}\n    {f.metadata.get('help', '')}")


def _run(args: argparse.Namespace) -> int:
    if args.command == "config" and args.config_command == "keys":
        _print_keys()
        return 0
    recipe = args.command == "data" and args.data_command in ("run", "train-classifier")  # not a training config
    cfg = load_config(args.config, args.overrides) if not recipe and (getattr(args, "config", None)
                                                                       or hasattr(args, "overrides")) else None
    if args.command == "train":
        from glm_dist.train.loop import train

        summary = train(cfg)
        if int(os.environ.get("RANK", 0)) == 0:
            print(json.dumps(summary, indent=2))
    elif args.command == "eval":
        from glm_dist.eval.run import main_eval

        main_eval(cfg, args.checkpoint)
    elif args.command == "export-hf":
        from glm_dist.hf.export import export_checkpoint

        print(export_checkpoint(args.checkpoint, args.out))
    elif args.command == "config":
        from glm_dist.config.checks import validate

        validate(cfg, world_size=args.world_size)
        if args.deepspeed:
            from glm_dist.config.deepspeed_json import deepspeed_config

            print(json.dumps(deepspeed_config(cfg, dp_size=args.world_size), indent=2))
        else:
            import yaml

            print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    elif args.command == "finetune":
        from glm_dist.train.finetune import FinetuneArgs, finetune

        result = finetune(FinetuneArgs(**{k: v for k, v in vars(args).items() if k != "command"}))
        print(json.dumps(result, indent=2))
    elif args.command == "data" and args.data_command == "docstring-task":
        from data_pipeline.embedded import docstring_task

        rows = docstring_task()
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{len(rows)} rows -> {args.out}")
    elif args.command == "plan":
        from glm_dist.config.checks import model_config, seq_len
        from glm_dist.parallel.plan import format_plan, model_shape, plan, recommend

        shape = model_shape(cfg.model.family, model_config(cfg))
        t, par = cfg.train, cfg.parallel
        global_batch = t.global_batch_size or t.micro_batch_size * t.grad_accum_steps * max(
            1, args.gpus // (par.pipeline_stages * par.tensor_parallel))
        layouts = plan(shape, gpus=args.gpus, gpus_per_node=args.gpus_per_node, seq_len=seq_len(cfg),
                       micro_batch=t.micro_batch_size, global_batch=global_batch,
                       precision="fp32" if t.precision == "fp32" else "bf16")
        best, ckpt = recommend(layouts, args.gpu_mem, checkpointing=True if cfg.train.activation_checkpointing else None)
        if args.json:
            print(json.dumps({"layouts": [vars(lay) for lay in layouts], "recommended": vars(best) if best else None,
                              "activation_checkpointing": ckpt}, indent=1))
        else:
            print(format_plan(f"{cfg.model.family}/{cfg.model.flavor}", shape, layouts, best, ckpt, args.gpus,
                              args.gpu_mem, global_batch, args.show))
    elif args.command == "data" and args.data_command == "train-classifier":
        from data_pipeline.filters.classifier import train
        from data_pipeline.readers import load_texts

        pos = load_texts(args.positive, args.text_field, args.max_docs)
        neg = load_texts(args.negative, args.text_field, args.max_docs)
        clf = train(pos, neg, l2=args.l2)
        clf.save(args.out)
        print(json.dumps(clf.info))
    elif args.command == "data" and args.data_command == "run":
        from data_pipeline.executors.local import run
        from data_pipeline.pipeline import Pipeline
        from data_pipeline.recipe import load_recipe

        recipe = load_recipe(args.config, args.overrides)
        if args.tasks:
            pipe = Pipeline(recipe)
            pipe.prepare()
            print(json.dumps(dict(pipe.stages())))
            return 0
        pipe = run(recipe, stage=args.stage, task=args.task)
        if args.stage is None:
            print(Path(pipe.out, "README.md").read_text())
    elif args.command == "data":
        from data_pipeline.tokenize.prepare import prepare_shards, prepare_tokenizer

        d = cfg.data
        spec = dict(source=d.source, out_dir=d.shards_dir, tokenizer=d.tokenizer, profile=d.tokenizer_profile,
                    vocab_size=d.vocab_size, val_per_mille=d.val_per_mille, shard_max_bytes=d.shard_max_bytes,
                    text_field=d.text_field)
        if args.prepare_only:
            print(prepare_tokenizer(**spec))
            return 0
        manifest = prepare_shards(workers=d.encode_workers, task=args.task, **spec)
        if manifest is not None:
            print(json.dumps({s: len(v) for s, v in manifest["splits"].items()}))
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("GLM_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    # The deepspeed launcher passes --local_rank=N before our arguments; LOCAL_RANK carries it too.
    for arg in [a for a in argv if a.startswith(("--local_rank=", "--local-rank="))]:
        os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        argv.remove(arg)
    if argv[:1] == ["launch"]:  # torchrun's own options follow: not parsed here
        from glm_dist.launch import main as launch_main

        return launch_main(argv[1:])
    if argv[:1] == ["slurm"]:
        from glm_dist.slurm import main as slurm_main

        try:
            return slurm_main(argv[1:])
        except (ConfigError, RuntimeError, FileNotFoundError) as err:
            print(f"glm slurm: error: {err}", file=sys.stderr)
            return 2
    args = _parser().parse_args(argv)
    from data_pipeline.pipeline import PipelineError
    from glm_dist.data.shards import ShardSetError
    from glm_dist.train.checkpoint import CheckpointError
    from glm_dist.train.errors import Preempted, TrainingDiverged

    try:
        return _run(args)
    except (ConfigError, CheckpointError, ShardSetError, FileNotFoundError, PipelineError) as err:
        print(f"glm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except TrainingDiverged as err:
        print(f"glm {args.command}: stopped: {err}", file=sys.stderr)
        return 3
    except Preempted as err:
        print(f"glm {args.command}: {err}", file=sys.stderr)
        return Preempted.exit_code


if __name__ == "__main__":
    sys.exit(main())
