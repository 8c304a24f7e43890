"""The ``glm`` command (stable names in docs/architecture.md#commands; run ``glm COMMAND --help``)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
import typing
from pathlib import Path

from glm_common.outlock import FolderLocked, acquire, held, output_lock
from glm_dist.config.loader import load_config, to_dict
from glm_dist.observability.crash_report import write_crash_report
from glm_dist.observability.redact import redact_process_output, redact_text

_run_dir: str | None = None  # the folder of the running command, where its crash report goes


def _config_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("-c", "--config", required=required, help="YAML config file (with optional base:)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override config keys, e.g. train.lr=3e-4")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glm", description="Pretrain generalized language models on DeepSpeed.")
    sub = parser.add_subparsers(dest="command", required=True)

    _config_args(sub.add_parser("train", help="train (one process, torchrun, deepspeed or srun)"))

    p = sub.add_parser("eval", help="validation loss / perplexity / bits per byte as JSON (-c), "
                                    "or lm-eval tasks (--tasks)")
    _config_args(p, required=False)
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    p.add_argument("--tasks", help="comma-separated lm-eval tasks (zero/few-shot), instead of validation perplexity")
    p.add_argument("--include-path", help="a folder of task YAMLs (glm data eval-tasks --out DIR)")
    p.add_argument("--num-fewshot", type=int, help="examples in each prompt (default: the task's, usually 0)")
    p.add_argument("--limit", type=float, help="documents per task (a fraction if < 1)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", default="lm_eval_results.json", help="where lm-eval's results JSON goes")
    p.add_argument("--curve", help="--tasks: score vs k, e.g. k=0,1,5 (--checkpoint A,B,...: and vs model size); "
                   "--out FILE.json gets the points, FILE_k.png and FILE_size.png the plots")
    p.add_argument("--contamination", help="--tasks: a crawl run's contamination.json; every score also on the "
                   "clean and the dirty items (matched by id)")
    p.add_argument("--documents", type=int, default=32, help="-c, decoder-only LMs: score this many held-out "
                   "documents whole (token-, word- and byte-level perplexity; 0: none)")
    p.add_argument("--stride", type=int, help="-c --documents: sliding windows of the context advance by this many "
                   "tokens (default: the context, disjoint windows; GPT-2's LM benchmarks used overlapping ones)")

    p = sub.add_parser("generate", help="continue a prompt from a checkpoint, streamed to stdout")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--strategy", choices=["greedy", "beam", "sample"], default="greedy")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-beams", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="sample: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample: nucleus mass (1.0: off)")
    p.add_argument("--seed", type=int, default=0)

    p = sub.add_parser("features", help="contextual features of texts (ELMo's biLM layers) from a checkpoint, as .npz")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    p.add_argument("--input", required=True, help="a text file (one text per line) or JSONL rows (--text-field)")
    p.add_argument("--out", required=True, help="the .npz to write: arrays '0', '1', ... in input order")
    p.add_argument("--text-field", default="text")
    p.add_argument("--batch-size", type=int, default=32)

    p = sub.add_parser("export-hf", help="write a folder transformers' from_pretrained loads")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)

    p = sub.add_parser("checkpoint", help="checkpoint maintenance")
    ksub = p.add_subparsers(dest="checkpoint_command", required=True)
    conv = ksub.add_parser("convert", help="a format-2 checkpoint (DeepSpeed's files + universal/) as format 3")
    conv.add_argument("--checkpoint", required=True)
    conv.add_argument("--out", required=True, help="a new folder")

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
    idx = dsub.add_parser("index", help="write the index file (documents' token counts, sentence lengths, "
                                        "byte offsets) of every shard of DIR that lacks one: random access for shard "
                                        "sets built before index files existed")
    idx.add_argument("dir", help="the shard set (data.shards_dir): a path or an fsspec URL")
    idx.add_argument("--workers", type=int, default=0, help="processes indexing shards (0: one per core)")
    cooc = dsub.add_parser("cooccur", help="GloVe: tokenize into DIR/tokens (word profile), then co-occurrence count "
                                           "shards in data.shards_dir (map per token shard, reduce per word block)")
    _config_args(cooc)
    cooc.add_argument("--stage", choices=["map", "reduce"], help="run only this stage (SLURM arrays; tokenize first)")
    cooc.add_argument("--task", type=int, help="with --stage: run only this task")
    vec = dsub.add_parser("vectors", help="a word-vector checkpoint (GloVe) as a text file: 'word v1 v2 ...' per line")
    vec.add_argument("--checkpoint", required=True, help="checkpoint directory (…/checkpoints/step_N)")
    vec.add_argument("--out", required=True, help="the text file to write")
    run = dsub.add_parser("run", help="the crawl pipeline: read, extract, filter, dedup, decontaminate, write")
    run.add_argument("-c", "--config", required=True, help="a recipe, e.g. configs/data/fineweb.yaml")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. input=... output=... benchmarks=...")
    run.add_argument("--stage", help="run only this stage (all its tasks, or --task); for SLURM arrays")
    run.add_argument("--task", type=int, help="with --stage: run only this task")
    run.add_argument("--tasks", action="store_true", help="print each stage's task count as JSON and exit")
    clf = dsub.add_parser("train-classifier",
                          help="train GPT-3's quality classifier (positives: curated text, negatives: crawl)")
    clf.add_argument("--positive", nargs="+", required=True,
                     help="curated text: JSONL/Parquet/text/WARC paths or globs")
    clf.add_argument("--negative", nargs="+", required=True, help="raw crawl: JSONL/Parquet/text/WARC paths or globs")
    clf.add_argument("--out", required=True, help="model file (.npz) for the recipe's classifier.model")
    clf.add_argument("--text-field", default="text")
    clf.add_argument("--max-docs", type=int, default=100_000, help="per class")
    clf.add_argument("--l2", type=float, default=0.1, help="L2 penalty (smaller: more confident scores)")
    tag = dsub.add_parser("tagging", help="CVT: sequence-labelling tasks (python3-doc references, WordNet) and "
                                          "unlabelled sentences as a tagging shard set in data.shards_dir")
    _config_args(tag)
    tag.add_argument("--tasks", default="pydoc_xref", help="comma-separated: pydoc_xref[,wordnet_pos]")
    tag.add_argument("--labelled", type=int, help="labelled training sentences per task (default: all)")
    tag.add_argument("--unlabelled", type=int, help="unlabelled sentences (default: all)")
    tag.add_argument("--test", type=int, help="held-out sentences per task (default: all)")
    tag.add_argument("--subset-seed", type=int, default=0, help="which labelled sentences --labelled keeps")
    task = dsub.add_parser("docstring-task",
                           help="write the built-in classification task (docstring -> module) as JSONL")
    task.add_argument("--out", required=True)
    gtx = dsub.add_parser("gettext", help="translation pairs (English -> a language) from gettext catalogs as "
                                          "train.jsonl / validation.jsonl (held out by message id) and stats.json")
    gtx.add_argument("--out", required=True, help="the pair folder (a translation config's data.source)")
    gtx.add_argument("--language", default="de", help="catalogs of this language (default de)")
    gtx.add_argument("--roots", nargs="+", default=["/usr/share/locale"],
                     help="folders searched for <language>/LC_MESSAGES/*.mo|po (default /usr/share/locale)")
    gtx.add_argument("--val-per-mille", type=int, default=50, help="messages held out, per thousand")
    tt = dsub.add_parser("token-tasks", help="WordNet example sentences as glm finetune rows: DIR/wordnet_span.jsonl "
                                             "(--task span) and DIR/wordnet_pos.jsonl (--task tokens)")
    tt.add_argument("--out", required=True)
    tt.add_argument("--wordnet-dir", help="WordNet's data.* files (default /usr/share/wordnet)")
    tt.add_argument("--parts", default="nvar", help="synsets of these parts of speech (n v a r)")
    tt.add_argument("--limit", type=int, help="rows per file (default: all)")
    evt = dsub.add_parser("eval-tasks", help="build the offline lm-eval tasks (data, card, YAML) into DIR/<task>/")
    evt.add_argument("--out", required=True, help="the folder to give glm eval --include-path")
    evt.add_argument("--tasks", help="comma-separated (default: all of glm_dist/eval/tasks)")
    evt.add_argument("--source", help="pydoc_cloze, doc_summary: a JSONL corpus of {id, text} documents "
                     "(default: the embedded one)")
    evt.add_argument("--wordnet-dir",
                     help="wordnet_mc, wordnet_qa: WordNet's data.* files (default /usr/share/wordnet)")

    p = sub.add_parser("finetune", help="classification from an encoder or GPT checkpoint, or text-to-text (JSONL/CSV)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train", required=True, help="JSONL or CSV rows with text (and text pair) and label")
    p.add_argument("--valid", help="held-out rows (default: 20%% of --train by row hash)")
    p.add_argument("--task", choices=["classify", "seq2seq", "entailment", "similarity", "multiple_choice", "span",
                                      "tokens"],
                   default="classify", help="classify: [CLS] / extract token + one matrix; seq2seq: text -> target "
                   "text (t5, bart); entailment, similarity, multiple_choice: GPT's input transformations; span: "
                   "SQuAD-style answer spans (context, question, answers; exact match and F1); tokens: a tag per word "
                   "(tokens, tags) -- both from encoders and XLNet")
    p.add_argument("--recipe", help="named option values (gpt: GPT's fine-tuning recipe) or a YAML file; "
                   "options given here win")
    p.add_argument("--prefix", help="seq2seq: a T5-style task prefix, e.g. 'summarize: '")
    p.add_argument("--text-field", help="the text, premise or multiple-choice context field (default text)")
    p.add_argument("--pair-field", help="second text of a pair task (e.g. text_b)")
    p.add_argument("--choices-field", help="multiple_choice: the field listing the candidates (default choices)")
    p.add_argument("--label-field", help="the label (classify), answer index (multiple_choice) or target text "
                   "(seq2seq) field (default label)")
    p.add_argument("--epochs", type=int, help="default 3")
    p.add_argument("--lr", type=float, help="default 5e-5")
    p.add_argument("--batch-size", type=int, help="default 16")
    p.add_argument("--max-len", type=int, help="default 128")
    p.add_argument("--lm-weight", type=float, help="GPT: weight of the auxiliary LM loss (default 0.5)")
    p.add_argument("--warmup", type=float, help="--schedule linear: warmup as a fraction of the steps (default 0.1)")
    p.add_argument("--dropout", type=float, help="GPT: dropout of the model and the classifier")
    p.add_argument("--schedule", choices=["linear", "stlr"], help="linear: warmup over --warmup then decay to 0 "
                   "(default); stlr: ULMFiT's slanted triangular rates (cut_frac 0.1, ratio 32)")
    p.add_argument("--discriminative-lr", type=float, help="ULMFiT: each layer group learns at the rate of the one "
                   "above / this factor (2.6); default off")
    p.add_argument("--gradual-unfreezing", action="store_true", default=None,
                   help="ULMFiT: train the top layer group first, one more group each epoch")
    p.add_argument("--adapters", type=int, help="Houlsby adapters of this bottleneck size (e.g. 64) after every "
                   "transformer block's attention and FFN; the pretrained weights frozen but the layer norms")
    p.add_argument("--bptt", type=int, help="AWD-LSTM: tokens per window of a long document (BPT3C, default 70)")
    p.add_argument("--drop-mult", type=float, help="AWD-LSTM: the classifier's dropouts are the LM's times this "
                   "(fastai's drop_mult; default 1)")
    p.add_argument("--seed", type=int)
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
            if f.name == getattr(sec_cls, "__extra__", None) and hasattr(sec_cls, "extra_keys"):
                for key, typ, default, help in sec_cls.extra_keys():  # the objectives' own keys
                    print(f"{section.name}.{key}: {typ} = {default!r}\n    {help}")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            typ = getattr(sec_hints[f.name], "__name__", str(sec_hints[f.name]).replace("typing.", ""))
            print(f"{section.name}.{f.name}: {typ} = {default!r}\n    {f.metadata.get('help', '')}")


def _run(args: argparse.Namespace) -> int:
    if args.command == "config" and args.config_command == "keys":
        _print_keys()
        return 0
    recipe = args.command == "data" and args.data_command in ("run", "train-classifier", "vectors", "index",
                                                                      "gettext")  # no config
    cfg = load_config(args.config, args.overrides) if not recipe and (getattr(args, "config", None)
                                                                       or hasattr(args, "overrides")) else None
    if args.command == "train":
        return _train(cfg)
    elif args.command == "eval" and args.tasks and args.curve:
        from glm_dist.eval.curve import parse_curve, run_curve

        curve = run_curve([c for c in args.checkpoint.split(",") if c], [t for t in args.tasks.split(",") if t],
                          parse_curve(args.curve), include_path=args.include_path, limit=args.limit,
                          batch_size=args.batch_size, out=args.out)
        if curve is not None:
            print(f"curve: {args.out} ({len(curve['points'])} points); plots: {', '.join(curve['plots'])}")
    elif args.command == "eval" and args.tasks and args.contamination:
        from glm_dist.eval.contamination import run_contamination

        run_contamination(args.checkpoint, [t for t in args.tasks.split(",") if t], contamination=args.contamination,
                          include_path=args.include_path, num_fewshot=args.num_fewshot, limit=args.limit,
                          batch_size=args.batch_size, out=args.out)
    elif args.command == "eval" and args.tasks:
        from glm_dist.eval.harness import run_tasks

        run_tasks(args.checkpoint, [t for t in args.tasks.split(",") if t], include_path=args.include_path,
                  num_fewshot=args.num_fewshot, limit=args.limit, batch_size=args.batch_size, out=args.out)
    elif args.command == "eval":
        from glm_dist.eval.run import main_eval

        if not args.config:
            raise FileNotFoundError("glm eval needs -c CONFIG (validation perplexity) or --tasks T1,T2 (lm-eval)")
        main_eval(cfg, args.checkpoint, documents=args.documents, stride=args.stride)
    elif args.command == "generate":
        from glm_dist.eval.stream import generate_to

        generate_to(sys.stdout, args.checkpoint, args.prompt, **{k: v for k, v in vars(args).items()
                                                                  if k not in ("command", "checkpoint", "prompt")})
    elif args.command == "features":
        from glm_dist.transfer.features import export_features, read_texts

        features = export_features(args.checkpoint, read_texts(args.input, text_field=args.text_field), out=args.out,
                                   batch_size=args.batch_size)
        print(json.dumps({"out": args.out, "texts": len(features), "first_shape": list(features[0].shape)}))
    elif args.command == "export-hf":
        from glm_dist.hf.export import export_checkpoint

        print(export_checkpoint(args.checkpoint, args.out))
    elif args.command == "checkpoint":
        from glm_dist.checkpoint.convert import convert

        print(json.dumps(convert(args.checkpoint, args.out)))
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
        from glm_dist.train.finetune import finetune
        from glm_dist.transfer.recipes import finetune_args

        result = finetune(finetune_args({k: v for k, v in vars(args).items() if k != "command"}))
        print(json.dumps(result, indent=2))
    elif args.command == "data" and args.data_command == "eval-tasks":
        from glm_dist.eval.tasks import build_tasks

        documents = None
        if args.source:
            from data_pipeline.tokenize.prepare import read_documents

            documents = read_documents(args.source)
        names = [t for t in args.tasks.split(",") if t] if args.tasks else None
        for name, folder in build_tasks(args.out, names, documents=documents, wordnet_dir=args.wordnet_dir).items():
            print(f"{name}: {folder}")
    elif args.command == "data" and args.data_command == "tagging":
        from data_pipeline.tasks.tagging_shards import build_tagging_set

        manifest = build_tagging_set(cfg.data.shards_dir, tasks=args.tasks.split(","), labelled_limit=args.labelled,
                                     unlabelled_limit=args.unlabelled, test_limit=args.test,
                                     subset_seed=args.subset_seed, vocab_size=cfg.data.vocab_size)
        print(json.dumps(manifest["tagging"]))
    elif args.command == "data" and args.data_command == "token-tasks":
        from data_pipeline.wordnet_heads import pos_rows, span_rows

        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, build in (("wordnet_span", span_rows), ("wordnet_pos", pos_rows)):
            rows = build(args.wordnet_dir, parts=args.parts, limit=args.limit)
            Path(args.out, f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            print(f"{name}: {len(rows)} rows -> {Path(args.out, name + '.jsonl')}")
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
                       precision="fp32" if t.precision == "fp32" else "bf16", vocab_parallel=par.vocab_parallel,
                       sequence_parallel=par.sequence_parallel)
        best, ckpt = recommend(layouts, args.gpu_mem,
                               checkpointing=True if cfg.train.activation_checkpointing else None)
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
        with _folder_lock(recipe.output, "glm data run", "output", task=args.task):
            pipe = run(recipe, stage=args.stage, task=args.task)
        if args.stage is None:
            print(Path(pipe.out, "README.md").read_text())
    elif args.command == "data" and args.data_command == "index":
        from data_pipeline.executors.cpus import available_cpus
        from glm_dist.data.index import index_shard_set

        with _folder_lock(args.dir, "glm data index", "DIR"):
            print(json.dumps(index_shard_set(args.dir, workers=args.workers or available_cpus())))
    elif args.command == "data" and args.data_command == "gettext":
        from data_pipeline.readers.gettext import catalog_paths
        from data_pipeline.translation_pairs import write_pairs

        catalogs = catalog_paths(args.language, args.roots)
        if not catalogs:
            raise FileNotFoundError(f"no {args.language} catalogs under {' '.join(args.roots)} (<language>/LC_MESSAGES/"
                                    f"*.mo): install the packages of launch/setup_env.sh's APT_PACKAGES")
        print(json.dumps(write_pairs(catalogs, args.out, val_per_mille=args.val_per_mille)))
    elif args.command == "data" and args.data_command == "vectors":
        print(json.dumps(_vectors(args.checkpoint, args.out)))
    elif args.command == "data":
        from glm_dist.config.checks import check_locations

        check_locations(cfg)
        with _folder_lock(cfg.data.shards_dir, f"glm data {args.data_command}", "data.shards_dir", task=args.task):
            return _tokenize(cfg, args)
    return 0


def _tokenize(cfg, args: argparse.Namespace) -> int:
    """``glm data tokenize`` (and ``glm data cooccur``): token shards, translation pairs or counts."""
    from data_pipeline.tokenize.prepare import prepare_shards, prepare_tokenizer
    from glm_dist.objectives.registry import get_objective

    d = cfg.data
    spec = dict(source=d.source, out_dir=d.shards_dir, tokenizer=d.tokenizer, profile=d.tokenizer_profile,
                vocab_size=d.vocab_size, val_per_mille=d.val_per_mille, shard_max_bytes=d.shard_max_bytes,
                text_field=d.text_field, max_record_mb=d.max_record_mb)
    if getattr(get_objective(cfg.objective.name), "pairs", False):  # a translation pair set
        from data_pipeline.tokenize.pairs import PairSpec, prepare_pairs

        manifest = prepare_pairs(PairSpec(source=d.source, out_dir=d.shards_dir, vectors=d.vectors,
                                          vocab_size=d.vocab_size, target_vocab_size=d.target_vocab_size,
                                          shard_max_bytes=d.shard_max_bytes, labelled_pairs=d.labelled_pairs))
        print(json.dumps({"splits": {s: len(v) for s, v in manifest["splits"].items()}, **manifest["source"]}))
        return 0
    if args.data_command == "cooccur" or getattr(get_objective(cfg.objective.name), "counts", False):
        return _cooccur(cfg, spec, stage=getattr(args, "stage", None), task=args.task)
    if args.prepare_only:
        print(prepare_tokenizer(**spec))
        return 0
    manifest = prepare_shards(workers=d.encode_workers, task=args.task, **spec)
    if manifest is not None:
        print(json.dumps({s: len(v) for s, v in manifest["splits"].items()}))
    return 0


def _train(cfg) -> int:
    """``glm train``: one writer per ``train.out_dir``. Rank 0 takes the folder's lock and every rank
    learns the outcome from it (a refusal ends every rank with exit code 2, rank 0 printing the line)."""
    from glm_dist.parallel import comm
    from glm_dist.parallel.distributed import init_distributed
    from glm_dist.train.loop import train

    global _run_dir
    _run_dir = cfg.train.out_dir
    dist = init_distributed(timeout_s=cfg.parallel.collective_timeout_s)
    lock, refusal = None, None
    if dist.is_main:
        try:
            lock = acquire(cfg.train.out_dir, command="glm train", key="train.out_dir")
        except Exception as err:  # noqa: BLE001 -- every rank must hear of it, or they wait for rank 0
            refusal = str(err) if isinstance(err, FolderLocked) else f"cannot lock train.out_dir: {err}"
    refusal = comm.first_error(refusal)
    if refusal is not None:
        if dist.is_main:
            raise FolderLocked(refusal)
        return 2
    with held(lock):
        summary = train(cfg)
    if dist.is_main:
        print(json.dumps(summary, indent=2))
    return 0


def _folder_lock(folder: str, command: str, key: str, *, task: int | None = None):
    """The output lock of a data command, unless it runs one task of a SLURM array (``--task``): the
    array's tasks share the folder, each writing only its own files."""
    return contextlib.nullcontext() if task is not None else output_lock(folder, command=command, key=key)


def _cooccur(cfg, spec: dict, *, stage: str | None, task: int | None) -> int:
    """``glm data cooccur`` (and ``glm data tokenize`` of a config whose objective trains on counts)."""
    from data_pipeline.cooccur.counts import CooccurSpec, prepare_cooccurrence
    from glm_dist.data.shards import read_shard

    d = cfg.data
    counts = CooccurSpec(out_dir=d.shards_dir, reader=read_shard, window=d.cooccur_window, blocks=d.cooccur_blocks,
                         shard_max_bytes=d.shard_max_bytes)
    tokenize = {k: v for k, v in spec.items() if k != "out_dir"}
    manifest = prepare_cooccurrence(counts, tokenize, workers=d.encode_workers, stage=stage, task=task)
    if manifest is not None:
        print(json.dumps(manifest["cooccurrence"]))
    return 0


def _vectors(checkpoint: str, out: str) -> dict:
    """``glm data vectors``: the checkpoint's word vectors (its model's ``vectors()``) in GloVe's text format."""
    from data_pipeline.cooccur.vectors import write_text
    from data_pipeline.tokenize.word import vocabulary
    from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
    from glm_dist.errors import GlmError
    from glm_dist.eval.run import load_checkpoint_model

    model, meta = load_checkpoint_model(checkpoint)
    if not hasattr(model, "vectors"):
        raise GlmError(f"checkpoint {checkpoint} is a {meta['model_family']} model, which has no word vectors")
    tok = checkpoint_tokenizer(checkpoint)
    words = [w if i not in tok.get_added_tokens_decoder() else "" for i, w in enumerate(vocabulary(tok))]
    vectors = model.vectors().float().numpy()
    return {"out": out, "words": write_text(out, words[:len(vectors)], vectors[:len(words)]), "dim": vectors.shape[1]}


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors whose message is for the user: one line, exit code 2."""
    from data_pipeline.errors import PipelineError
    from glm_dist.errors import GlmError

    return GlmError, PipelineError, FileNotFoundError


def main(argv: list[str] | None = None) -> int:
    """``glm``: a user's mistake or a bad input ends in one line and exit code 2; an unexpected
    error in a one-line summary and the path of its full traceback (exit code 1).

    A rank of a multi-process run ends with ``os._exit`` once its output is flushed: its work is done
    (process group destroyed, checkpoints committed, W&B finished), and the interpreter's teardown can
    still abort it -- C++ threads of gloo or of a library it loaded, destroyed after Python's, end in
    "terminate called without an active exception" (SIGABRT), which turned a finished two-rank run into
    a failed one in CI. Its exit code is then the command's."""
    code = _main(argv)
    world = os.environ.get("WORLD_SIZE", "")
    if "torch.distributed" in sys.modules and world.isdigit() and int(world) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    from glm_dist.checkpoint.files import force_weights_only

    force_weights_only()  # no torch.load of this process runs pickled code
    logging.basicConfig(level=os.environ.get("GLM_LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    redact_process_output()  # no credential in a log line, a warning or fsspec's cache metadata
    argv = sys.argv[1:] if argv is None else argv
    # The deepspeed launcher passes --local_rank=N before our arguments; LOCAL_RANK carries it too.
    for arg in [a for a in argv if a.startswith(("--local_rank=", "--local-rank="))]:
        os.environ.setdefault("LOCAL_RANK", arg.split("=", 1)[1])
        argv.remove(arg)
    command = argv[0] if argv else "glm"
    try:
        code = _dispatch(argv)
        if "torch.distributed" in sys.modules:  # a command that joined a process group leaves it
            from glm_dist.parallel.distributed import shutdown_distributed

            shutdown_distributed()
        return code
    except _user_errors() as err:
        print(redact_text(f"glm {command}: error: {err}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glm {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug, not a user's mistake: a summary here, the traceback in a file
        where = err.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        at = f" at {Path(where.tb_frame.f_code.co_filename).name}:{where.tb_lineno}" if where else ""
        print(redact_text(f"glm {command}: internal error: {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}{at}; "
                          f"{write_crash_report(command, err, run_dir=_run_dir)} (please report it)"), file=sys.stderr)
        return 1


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["launch"]:  # torchrun's own options follow: not parsed here
        from glm_dist.launch import main as launch_main

        return launch_main(argv[1:])
    if argv[:1] == ["slurm"]:
        from glm_dist.slurm import main as slurm_main

        try:
            return slurm_main(argv[1:])
        except RuntimeError as err:
            print(f"glm slurm: error: {err}", file=sys.stderr)
            return 2
    args = _parser().parse_args(argv)
    from glm_dist.train.errors import Preempted, TrainingDiverged

    try:
        return _run(args)
    except TrainingDiverged as err:
        print(f"glm {args.command}: stopped: {err}", file=sys.stderr)
        return 3
    except Preempted as err:
        print(f"glm {args.command}: {err}", file=sys.stderr)
        return Preempted.exit_code


if __name__ == "__main__":
    sys.exit(main())
