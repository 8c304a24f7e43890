"""``glm plan``: memory per GPU of every (DP, PP, TP, ZeRO, offload) layout of a config's model on a cluster,
and the layout to use."""

from __future__ import annotations

import argparse
import json
import math

from glm_dist.commands.shared import config_args, in_range
from glm_dist.config.checks import model_config, seq_len
from glm_dist.config.loader import load_config
from glm_dist.errors import GlmError
from glm_dist.families.registry import family
from glm_dist.parallel.plan import format_plan, model_shape, plan, recommend

HELP = "memory per GPU of every (DP, PP, TP, ZeRO, offload) layout, and the one to use"


def add_arguments(p: argparse.ArgumentParser) -> None:
    config_args(p)
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="GB per GPU (default 80)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--show", type=int, default=20, help="layouts listed")
    p.add_argument("--json", action="store_true", help="all layouts as JSON")


def check_cluster(args: argparse.Namespace) -> None:
    """A cluster that exists: a plan for 0 or -8 GPUs, or GPUs of 0 GB, was printed as an empty table."""
    in_range("--gpus", args.gpus, 1)
    in_range("--gpus-per-node", args.gpus_per_node, 1)
    if not (math.isfinite(args.gpu_mem) and args.gpu_mem > 0):
        raise GlmError(f"--gpu-mem {args.gpu_mem} must be a number of GB > 0")


def run(args: argparse.Namespace) -> int:
    check_cluster(args)
    cfg = load_config(args.config, args.overrides)
    shape = model_shape(family(cfg.model.family), model_config(cfg))
    t, par = cfg.train, cfg.parallel
    global_batch = t.global_batch_size or t.micro_batch_size * t.grad_accum_steps * max(
        1, args.gpus // (par.pipeline_stages * par.tensor_parallel)
    )
    layouts = plan(
        shape,
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        seq_len=seq_len(cfg),
        micro_batch=t.micro_batch_size,
        global_batch=global_batch,
        precision="fp32" if t.precision == "fp32" else "bf16",
        vocab_parallel=par.vocab_parallel,
        sequence_parallel=par.sequence_parallel,
    )
    best, ckpt = recommend(layouts, args.gpu_mem, checkpointing=True if t.activation_checkpointing else None)
    if args.json:
        print(
            json.dumps(
                {
                    "layouts": [vars(lay) for lay in layouts],
                    "recommended": vars(best) if best else None,
                    "activation_checkpointing": ckpt,
                },
                indent=1,
            )
        )
    else:
        print(
            format_plan(
                f"{cfg.model.family}/{cfg.model.flavor}",
                shape,
                layouts,
                best,
                ckpt,
                args.gpus,
                args.gpu_mem,
                global_batch,
                args.show,
            )
        )
    return 0
