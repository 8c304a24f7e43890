"""train.compile: every transformer block runs as a dynamo-compiled graph (no graph break, no
fallback to eager), gives the eager numbers, with activation checkpointing, ZeRO-2 and a pipeline;
ZeRO-3 and tensor parallelism are refused. The tests compile with the aot_eager backend (dynamo's
capture and AOT autograd, no kernel generation: seconds instead of minutes on 2 cores);
bench/train_throughput.py --compile times inductor."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from glm_dist.config.loader import ConfigError, load_config
from glm_dist.config.checks import validate
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.families.registry import build_model, resolve_model_config
from glm_dist.objectives.registry import get_objective
from glm_dist.parallel.compile import compile_blocks, transformer_blocks
from tests.conftest import FAST, ROOT, TINY, clean_env, tagged_json, train_losses


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)  # a dense and a banded block (window 8 < 32 tokens): two block graphs
    return GPT(gpt_config("tiny", n_layer=2, d_model=64, n_head=4, vocab_size=300, sparse_window=8))


def _loss_and_grads(model: GPT, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss, _ = get_objective("clm").loss(model, batch, metrics=False)
    return loss.detach(), [g.clone() for g in torch.autograd.grad(loss, list(model.parameters()))]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_blocks_run_compiled_without_graph_breaks_and_match_eager(checkpointing):
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _gpt(), _gpt()
    assert compile_blocks(compiled, backend="aot_eager") == 2
    for m in (eager, compiled):
        m.activation_checkpointing = checkpointing
    ids = torch.randint(0, 300, (2, 33), generator=torch.Generator().manual_seed(1))
    batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
    ref_loss, ref_grads = _loss_and_grads(eager, batch)
    for _ in range(2):  # the second step runs the cached graphs
        loss, grads = _loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert counters["frames"]["ok"] >= 2 and counters["frames"]["ok"] == counters["frames"]["total"]
    assert counters["stats"]["unique_graphs"] == 2  # one per kind of block, shared by blocks alike
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["inline_call"] and not counters["eager"], "a block fell back to eager"
    assert list(compiled.state_dict()) == list(eager.state_dict())  # names DeepSpeed and checkpoints see


@pytest.mark.parametrize(
    "family,flavor,blocks",
    [
        ("gpt", "tiny", 4),
        ("bert", "bert-tiny", 2),
        ("albert", "albert-tiny", 1),
        ("electra", "electra-tiny", 4),
        ("t5", "t5-tiny", 4),
        ("bart", "bart-tiny", 4),
    ],
)
def test_blocks_are_the_outermost_module_lists_each_once(family, flavor, blocks):
    with torch.device("meta"):
        model = build_model(family, resolve_model_config(family, flavor))
    found = transformer_blocks(model)
    assert len(found) == blocks and len({id(b) for b in found}) == blocks  # ALBERT's shared block once


def test_a_model_without_blocks_is_refused():
    with pytest.raises(ValueError, match="found no transformer blocks in Linear"):
        compile_blocks(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("layout,world", [(["parallel.zero_stage=3"], 2), (["parallel.tensor_parallel=2"], 2)])
def test_zero3_and_tensor_parallelism_are_refused_before_anything_runs(layout, world):
    cfg = load_config(TINY, ["train.compile=true", *layout])
    with pytest.raises(ConfigError, match="train.compile=true .* runs with ZeRO 0-2 and no tensor parallelism"):
        validate(cfg, world_size=world)


FIT_SCRIPT = r"""
import json, sys
from torch._dynamo.utils import counters
from glm_dist.config.loader import load_config
from glm_dist.train.loop import Trainer

trainer = Trainer(load_config(sys.argv[1], sys.argv[2:]))
trainer.fit()
print("RESULT" + json.dumps({"rank": trainer.dist.rank, "frames": dict(counters["frames"]),
                             "breaks": sum(counters["graph_break"].values())}))
"""


def _fit(args: list[str], out_dir, nproc: int = 1) -> tuple[list[float], list[dict]]:
    """(train losses, each rank's dynamo counters) of a 3-step run of ``FIT_SCRIPT``."""
    script = out_dir.parent / "fit.py"
    script.write_text(FIT_SCRIPT)
    launch = (
        [sys.executable]
        if nproc == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    )
    proc = subprocess.run(
        [
            *launch,
            str(script),
            TINY,
            *FAST,
            f"train.out_dir={out_dir}",
            "train.max_steps=3",
            "train.grad_accum_steps=2",
            *args,
        ],
        cwd=ROOT,
        env=clean_env(max(1, 2 // nproc)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = tagged_json(proc.stdout, "RESULT")
    return train_losses(out_dir), results


@pytest.mark.slow
def test_compiled_training_follows_eager_with_checkpointing_zero2_and_a_pipeline(shards_dir, tmp_path):
    """One process with ZeRO-2 and activation checkpointing, and PP=2 with ZeRO-1 (without
    checkpointing: DeepSpeed's pipeline checkpoints the embedding too, which fails compiled or not)."""
    compiled = [f"data.shards_dir={shards_dir}", "train.compile=true", "train.compile_backend=aot_eager"]
    ckpt_zero2 = ["train.activation_checkpointing=true", "parallel.zero_stage=2"]
    eager, _ = _fit([f"data.shards_dir={shards_dir}", *ckpt_zero2], tmp_path / "eager")
    zero2, [one] = _fit([*compiled, *ckpt_zero2], tmp_path / "zero2")
    pipe, ranks = _fit([*compiled, "parallel.pipeline_stages=2", "parallel.zero_stage=1"], tmp_path / "pipe", nproc=2)
    assert len(eager) == 3 and zero2 == pytest.approx(eager, abs=1e-5) and pipe == pytest.approx(eager, abs=1e-4)
    for r in [one, *ranks]:  # every stage ran its blocks compiled, none broke a graph or fell back
        assert r["frames"]["ok"] > 0 and r["frames"]["ok"] == r["frames"]["total"] and r["breaks"] == 0, r
