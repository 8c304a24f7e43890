"""train.compile: every transformer block (scope blocks) or the whole model with its fused loss (scope
model) runs as dynamo-compiled graphs (no graph break, no fallback to eager), gives the eager numbers,
with activation checkpointing, ZeRO-1/2 with bf16 and (blocks) a pipeline; ZeRO-3 and tensor parallelism
are refused, and so is the model scope under a pipeline. The tests compile with the aot_eager backend
(dynamo's capture and AOT autograd, no kernel generation: seconds instead of minutes on 2 cores);
bench/train_throughput.py --compile blocks|model|both times inductor."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

from glm_dist.config.loader import ConfigError, load_config
from glm_dist.config.checks import validate
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.families.registry import build_model, resolve_model_config
from glm_dist.objectives.registry import get_objective
from glm_dist.ops.cross_entropy import linear_cross_entropy
from glm_dist.parallel.compile import compile_blocks, compile_model, transformer_blocks
from tests.conftest import FAST, ROOT, TINY, clean_env, tagged_json, train_losses


def _gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)  # a dense and a banded block (window 8 < 32 tokens): two block graphs
    return GPT(gpt_config("tiny", n_layer=2, d_model=64, n_head=4, vocab_size=300, sparse_window=8))


def _loss_and_grads(model: GPT, batch: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss, _ = get_objective("clm").loss(model, batch, metrics=False)
    return loss.detach(), [g.clone() for g in torch.autograd.grad(loss, list(model.parameters()))]


def _batch() -> dict:
    ids = torch.randint(0, 300, (2, 33), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


def _assert_matches(compiled: GPT, eager: GPT, batch: dict) -> None:
    ref_loss, ref_grads = _loss_and_grads(eager, batch)
    for _ in range(2):  # the second step runs the cached graphs
        loss, grads = _loss_and_grads(compiled, batch)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_blocks_run_compiled_without_graph_breaks_and_match_eager(checkpointing):
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = _gpt(), _gpt()
    assert compile_blocks(compiled, backend="aot_eager") == 2
    for m in (eager, compiled):
        m.activation_checkpointing = checkpointing
    _assert_matches(compiled, eager, _batch())
    assert counters["frames"]["ok"] >= 2 and counters["frames"]["ok"] == counters["frames"]["total"]
    assert counters["stats"]["unique_graphs"] == 2  # one per kind of block, shared by blocks alike
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["inline_call"] and not counters["eager"], "a block fell back to eager"
    assert list(compiled.state_dict()) == list(eager.state_dict())  # names DeepSpeed and checkpoints see


def test_the_whole_model_with_its_fused_loss_is_one_graph_and_matches_eager():
    """Scope model: embedding, both blocks (under activation checkpointing), the final norm and the
    chunked loss's forward and gradient (one autograd.Function, its chunk loop unrolled) in one graph."""
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def capture(gm, example_inputs):  # aot_eager, keeping every graph dynamo hands over
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, example_inputs)

    eager, compiled = _gpt(), _gpt()
    assert compile_model(compiled, scope="model", backend=capture) == 1
    for m in (eager, compiled):
        m.activation_checkpointing = True
    _assert_matches(compiled, eager, _batch())
    assert counters["frames"]["ok"] == counters["frames"]["total"] == 1 and len(graphs) == 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    ops = {str(n.target) for gm in graphs for sub in gm.modules() if hasattr(sub, "graph") for n in sub.graph.nodes}
    assert {"exp_", "scatter_add_", "autograd_function_apply", "tag_activation_checkpoint"} <= ops, sorted(ops)
    assert list(compiled.state_dict()) == list(eager.state_dict())


def test_the_loss_kernel_inside_a_compiled_model_is_traced_not_nested():
    """On CUDA each chunk goes through its own compiled kernel; inside a compiled model the kernel's
    function joins the model's graph instead (no nested compile, no trace through its cache)."""
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(2)
    h, w = torch.randn(40, 16, generator=g, requires_grad=True), torch.randn(300, 16, generator=g, requires_grad=True)
    t = torch.randint(0, 300, (40,), generator=g)

    def nll(compiled: bool) -> torch.Tensor:
        return linear_cross_entropy(h, w, t, chunk_tokens=16, compiled=compiled).nll

    ref = nll(False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*lru_cache")  # dynamo tracing through the kernel's cache
        out = torch.compile(nll, backend="aot_eager")(True)
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad(out, [h, w]), torch.autograd.grad(ref, [h, w])):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_compile_true_is_the_blocks_scope_and_model_is_a_scope():
    assert load_config(TINY, ["train.compile=true"]).train.compile == "blocks"  # configs and checkpoints before scopes
    assert load_config(TINY, ["train.compile=false"]).train.compile is False
    assert load_config(TINY, ["train.compile=model"]).train.compile == "model"
    with pytest.raises(ConfigError, match=r"'train.compile' = 'graph' .*must be one of"):
        load_config(TINY, ["train.compile=graph"])


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


@pytest.mark.parametrize(
    "args,match",
    [
        (["train.compile=true", "parallel.zero_stage=3"], "train.compile=blocks .* runs with ZeRO 0-2 and no tensor"),
        (["train.compile=model", "parallel.tensor_parallel=2"], "train.compile=model .* runs with ZeRO 0-2 and no"),
        (["train.compile=model", "parallel.pipeline_stages=2"], "compiles the whole model, which a pipeline"),
        (["train.compile=model", "train.compile_mode=reduce-overhead", "train.compile_backend=eager"], "is inductor's"),
    ],
)
def test_layouts_a_compile_scope_cannot_run_are_refused_before_anything_runs(args, match):
    with pytest.raises(ConfigError, match=match):
        validate(load_config(TINY, args), world_size=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_graphs_are_refused_without_cuda():
    with pytest.raises(ConfigError, match="reduce-overhead replays CUDA graphs and this machine has no CUDA"):
        compile_model(torch.nn.Linear(2, 2), scope="model", mode="reduce-overhead")


FIT_SCRIPT = r"""
import json, sys
from torch._dynamo.utils import counters
from glm_dist.config.loader import load_config
from glm_dist.train.loop import Trainer

trainer = Trainer(load_config(sys.argv[1], sys.argv[2:]))
trainer.fit()
print("RESULT" + json.dumps({"rank": trainer.dist.rank, "frames": dict(counters["frames"]),
                             "breaks": sum(counters["graph_break"].values()),
                             "graphs": counters["stats"]["unique_graphs"]}))
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


@pytest.mark.slow
def test_whole_model_compiled_training_follows_eager_at_zero1_bf16(shards_dir, tmp_path):
    """glm train with train.compile=model under DeepSpeed ZeRO-1 and its bf16 optimizer: the losses of
    the eager run, two graphs (training; validation under no_grad) and no break. DeepSpeed's forward
    hooks on the module run as frames of their own that capture no tensor op."""
    args = [f"data.shards_dir={shards_dir}", "train.precision=bf16", "parallel.zero_stage=1"]
    eager, _ = _fit(args, tmp_path / "eager")
    model, [r] = _fit([*args, "train.compile=model", "train.compile_backend=aot_eager"], tmp_path / "model")
    assert len(eager) == 3 and model == pytest.approx(eager, abs=1e-5)
    assert r["graphs"] == 2 and r["frames"]["ok"] == r["frames"]["total"] and r["breaks"] == 0, r
