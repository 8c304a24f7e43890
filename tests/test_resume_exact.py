"""A resumed run continues exactly as the uninterrupted one, in every precision and ZeRO stage:
the checkpoint holds the real fp32 masters and Adam moments of whichever optimizer wrapper
DeepSpeed runs, and the weights several steps after the resume are the uninterrupted run's, bit
for bit (one process, one thread: the math is deterministic). bf16 + ZeRO-0 used to run DeepSpeed's
FP16_UnfusedOptimizer, whose bf16 weights were saved as the masters and whose moments were not
saved at all: its resumed weights drifted away after the first step."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FAST, TINY, results_by_combo

pytestmark = pytest.mark.slow
COMBOS = [(precision, zero) for precision in ("fp32", "bf16") for zero in (0, 1, 2, 3)]
STEPS, SAVED_AT = 6, 3

# One process for every combination (DeepSpeed's start-up once): per combination, the run saves at
# step 3 on its way to step 6, then a second run resumes from that save and goes on to step 6.
SCRIPT = r"""
import contextlib, json, sys
import deepspeed, torch
from glm_dist.config.loader import load_config
from glm_dist.parallel import fragments
from glm_dist.train.loop import Trainer, read_metrics

def masters(trainer):
    sizes = {"data": 1, "tensor": 1}
    return {p.name: p.view("fp32").detach().float().clone()
            for p in fragments.pieces(trainer.engine, trainer.naming, trainer.coords, sizes)}

def weights(trainer):
    params = list(trainer.engine.module.parameters())
    zero3 = hasattr(params[0], "ds_id")
    if zero3:  # the last validation's prefetched parameters are still in flight: gathering them again fails
        trainer.engine.empty_partition_cache()
    with deepspeed.zero.GatheredParameters(params) if zero3 else contextlib.nullcontext():
        return {n: p.detach().float().clone() for n, p in trainer.engine.module.named_parameters()}

def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)

config, overrides, shards, root, steps, saved_at, *combos = sys.argv[1:]
overrides = json.loads(overrides)
for combo in combos:
    precision, zero = combo.split(":")
    def trainer(name, *extra):
        return Trainer(load_config(config, [*overrides, f"data.shards_dir={shards}", f"train.precision={precision}",
                                            f"train.out_dir={root}/{combo}-{name}", f"parallel.zero_stage={zero}",
                                            f"train.max_steps={steps}", *extra]))
    straight = trainer("straight", f"train.save_interval={saved_at}")
    fresh = not any(fragments.base_optimizer(straight.engine).state.values())  # no step before the first
    straight.fit()
    resumed = trainer("resumed", f"train.resume={root}/{combo}-straight/checkpoints/step_{int(saved_at):08d}")
    resumed.fit()
    print("RESULT" + json.dumps({
        "combo": combo, "optimizer": type(straight.engine.optimizer).__name__, "fresh": fresh,
        "steps": [fragments.optimizer_step(t.engine)["step"] for t in (straight, resumed)],
        "masters": max_diff(masters(straight), masters(resumed)),
        "weights": max_diff(weights(straight), weights(resumed)),
        "losses": [[r["loss"] for r in read_metrics(t.cfg.train.out_dir)][-(int(steps) - int(saved_at)):]
                   for t in (straight, resumed)]}), flush=True)
"""


@pytest.fixture(scope="module")
def results(shards_dir, tmp_path_factory) -> dict[tuple[str, int], dict]:
    root = tmp_path_factory.mktemp("resume")
    overrides = [*FAST, "train.grad_accum_steps=2", "train.eval_batches=1"]
    args = [TINY, json.dumps(overrides), shards_dir, str(root), str(STEPS), str(SAVED_AT)]
    return results_by_combo(SCRIPT, args, COMBOS)


@pytest.mark.parametrize("precision,zero", COMBOS)
def test_resumed_run_has_the_uninterrupted_runs_weights_and_losses(precision, zero, results):
    r = results[precision, zero]
    assert r["masters"] == 0.0 and r["weights"] == 0.0, r
    assert r["losses"][0] == r["losses"][1], r
    assert r["steps"] == [STEPS, STEPS], r  # the optimizer counted every training step, and only those


@pytest.mark.parametrize("precision,zero", COMBOS)
def test_optimizer_keeps_flat_fp32_masters_and_takes_no_step_when_built(precision, zero, results):
    """bf16 runs BF16_Optimizer (ZeRO-0/1) or ZeRO's partitions, never the per-tensor unfused wrapper,
    which took an AdamW step with zero gradients when built (weight decay once, step count 1)."""
    r = results[precision, zero]
    expected = {
        0: "SkippableAdamW" if precision == "fp32" else "BF16_Optimizer",
        1: "DeepSpeedZeroOptimizer" if precision == "fp32" else "BF16_Optimizer",
        2: "DeepSpeedZeroOptimizer",
        3: "DeepSpeedZeroOptimizer_Stage3",
    }[zero]
    assert r["optimizer"] == expected and r["fresh"], r
