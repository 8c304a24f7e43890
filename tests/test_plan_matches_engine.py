"""glm plan against what DeepSpeed's engine allocates: ZeRO 0-3 in bf16 on one and two ranks (and in
fp32 on two), the bytes of every tensor reachable from the engine (parameters, gradients, optimizer states, reduce
buckets, flat gradient copies; each storage once) at their largest while the backward runs and in
the gradient reduction and optimizer step after it, within 10% of what glm plan counts (offloaded, at
ZeRO 1-3 in bf16 on one rank: its device plus host bytes, one memory on the CPU); and, at bf16
ZeRO 0-2, the true peak of live bytes through two steps (the profiler's allocation events replayed:
transient copies and activations included) within 10% of glm plan's total."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from glm_dist.config.checks import model_config
from glm_dist.config.deepspeed_json import zero_buffers
from glm_dist.config.loader import load_config
from glm_dist.families.registry import family
from glm_dist.parallel.plan import GB, model_shape, model_state_bytes, phase_bytes, plan, recommend
from tests.conftest import ROOT, TINY, clean_env, tagged_json

TINY_MODEL = [
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=4",
    "model.vocab_size=2048",
    "data.seq_len=64",
    "train.micro_batch_size=4",
]
# wider, with fewer activations: the model states and DeepSpeed's copies make the peak
WIDE_MODEL = [*TINY_MODEL, "model.d_model=256", "data.seq_len=32", "train.micro_batch_size=2"]

# Builds glm train's engine for each ZeRO stage in turn (the same model, optimizer and DeepSpeed JSON),
# takes two steps on random tokens and prints, per rank, the largest bytes reachable from the engine:
# "backward" while the activations are alive (after the backward; at ZeRO-2 just before the buckets
# are freed; at ZeRO-3 after every module's forward and backward), "step" after it (each flat copy
# DeepSpeed makes, with the copy counted while it is alive, plus the fp32 gradient the optimizer step
# then receives from it; the optimizer step itself).
ENGINE_SCRIPT = r"""
import gc, json, sys, types
from collections import deque
import torch
from glm_dist.config.checks import model_config
from glm_dist.config.loader import load_config
from glm_dist.families.registry import build_model
from glm_dist.objectives.clm import CLM
from glm_dist.parallel.distributed import init_distributed
from glm_dist.parallel.engine import build_engine
from glm_dist.train.optim import build_optimizer

LEAVES = (str, bytes, int, float, bool, type(None), type, types.ModuleType, types.FunctionType,
          types.BuiltinFunctionType, types.MethodType)
WALKED = ("deepspeed", "torch", "glm_dist", "collections")  # objects whose attributes may hold tensors


def storages(*roots):
    # storage address -> bytes of every tensor reachable from roots, breadth first (each object once)
    seen, found, queue = set(), {}, deque(roots)
    while queue:
        obj = queue.popleft()
        if id(obj) in seen or isinstance(obj, LEAVES):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta" and obj.untyped_storage().nbytes():
                found[obj.untyped_storage().data_ptr()] = obj.untyped_storage().nbytes()
            queue.extend([obj.grad if obj.is_leaf else None, *vars(obj).values()])  # ds_tensor, _hp_mapping, ...
        elif isinstance(obj, dict):
            queue.extend([*obj.keys(), *obj.values()])
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            queue.extend(obj)
        elif type(obj).__module__.startswith(WALKED) and not type(obj).__module__.startswith("torch.distributed"):
            queue.extend(getattr(obj, "__dict__", {}).values())
    return found


def allocations(node):
    # (time, address, bytes) of every allocation (+) and free (-) under a profiler event, in tree order
    if type(node.extra_fields).__name__ == "_ExtraFields_Allocation":
        yield node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size
    for child in node.children:
        yield from allocations(child)


def live_peak(run):
    # run()'s result and the most bytes allocated inside it alive at one time: the profiler's
    # allocation events replayed in time order (blocks made before run() are not counted)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        row = run()
    events = sorted(e for root in prof.profiler.kineto_results.experimental_event_tree() for e in allocations(root))
    blocks, live, peak = {}, 0, 0
    for _, ptr, size in events:
        if size > 0:
            blocks[ptr] = size
        live += size if size > 0 else -blocks.pop(ptr, 0)
        peak = max(peak, live)
    return row, peak


def measure(cfg, world_size):
    torch.manual_seed(0)
    model = build_model(cfg.model.family, model_config(cfg))
    optimizer = build_optimizer(model, cfg.train)
    engine = build_engine(model, optimizer, cfg, dp_size=world_size)
    wrapper = engine.optimizer
    peak, state = {"backward": 0, "step": 0, "bucket_elements": 0}, {"phase": "backward", "flat": None}
    held = lambda *extra: sum(storages(engine, extra).values())

    def buckets():  # the largest reduce bucket allocated now (ZeRO-2 frees its two after each backward)
        for bucket in getattr(wrapper, "ipg_buckets", {}).values():
            for buffer in [bucket.buffer] if torch.is_tensor(bucket.buffer) else bucket.buffer:
                peak["bucket_elements"] = max(peak["bucket_elements"], buffer.numel())

    def note(phase, value):
        peak[phase] = max(peak[phase], value)

    def before(owner, name, hook):
        call = getattr(owner, name)
        setattr(owner, name, lambda *a, **k: (hook(), call(*a, **k))[1])

    def flat_copies(owner, after_backward):
        flatten = owner.flatten

        def counted(tensors):
            flat = flatten(tensors)
            if after_backward or state["phase"] == "step":
                state["flat"] = storages(engine, [flat])
                # the engine casts its flat copy to the communication dtype (bf16) to all-reduce it
                cast = engine.communication_data_type if owner is engine else flat.dtype
                note("step", sum(state["flat"].values()) + flat.numel() * cast.itemsize * (cast != flat.dtype))
            else:
                note("backward", held(flat))
            return flat
        owner.flatten = counted

    def optimizer_step():
        note("step", held())
        if state["flat"] is not None:  # the fp32 gradient cast from the last flat copy while that was alive
            fp32 = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for group in optimizer.param_groups
                    for p in group["params"] if (t := p.grad) is not None and t.dtype == torch.float32}
            note("step", sum(state["flat"].values()) + sum(n for k, n in fp32.items() if k not in state["flat"]))
            state["flat"] = None

    flat_copies(engine, after_backward=True)  # the engine's all-reduce of ZeRO-0/1 gradients
    if "flatten" in vars(wrapper):
        flat_copies(wrapper, after_backward=False)
    if hasattr(wrapper, "_release_ipg_buffers"):
        before(wrapper, "_release_ipg_buffers", lambda: (note("backward", held()), buckets()))
    before(wrapper, "step", lambda: state.update(phase="step"))
    before(optimizer, "step", optimizer_step)
    if cfg.parallel.zero_stage == 3:  # gathered parameters and their gradients
        for module in engine.module.modules():
            module.register_forward_hook(lambda *a: note("backward", held()))
            module.register_full_backward_hook(lambda *a: note("backward", held()))
    for _ in range(2):
        state["phase"] = "backward"
        tokens = torch.randint(0, model_config(cfg).vocab_size, (cfg.train.micro_batch_size, cfg.data.seq_len))
        loss, _ = CLM.loss(engine, {"input_ids": tokens, "labels": tokens}, metrics=False)  # glm train's loss
        engine.backward(loss)
        del loss
        note("backward", held())
        buckets()
        engine.step()
    params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())  # ZeRO-3: the whole tensors'
    offloaded = [getattr(wrapper, "cpu_offload", False) or getattr(wrapper, "offload_optimizer", False),
                 getattr(wrapper, "offload_param", False)]  # what DeepSpeed's wrapper took from the JSON
    offload = {(True, False): "optimizer", (True, True): "optimizer+params"}.get(tuple(offloaded), "none")
    return {"optimizer": type(wrapper).__name__, "params": params, "offload": offload, **peak}


dist = init_distributed()
SWITCHES = {"none": [], "optimizer": ["parallel.offload_optimizer=true"],
            "optimizer+params": ["parallel.offload_optimizer=true", "parallel.offload_params=true"]}
for stage, offload in json.loads(sys.argv[1]):  # [[zero stage, glm plan's offload], ...]
    cfg = load_config(sys.argv[2], [*sys.argv[3:], f"parallel.zero_stage={stage}", *SWITCHES[offload]])
    row, row["transient"] = live_peak(lambda: measure(cfg, dist.world_size))
    gc.collect()  # the engine's cycles (parameters and their DeepSpeed-bound methods) before the next stage
    print("ENGINE_BYTES" + json.dumps({"rank": dist.rank, "zero": stage, **row}), flush=True)
"""

# DeepSpeed's optimizer wrapper per ZeRO stage, as glm plan accounts for it (bf16 ZeRO-0 runs as ZeRO-1)
WRAPPERS = {
    "bf16": ["BF16_Optimizer", "BF16_Optimizer", "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3"],
    "fp32": ["SkippableAdamW", "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer", "DeepSpeedZeroOptimizer_Stage3"],
}


ZERO_STAGES = ((0, "none"), (1, "none"), (2, "none"), (3, "none"))


def engine_bytes(world: int, precision: str, tmp_path, model=TINY_MODEL, combos=ZERO_STAGES) -> dict[tuple, dict]:
    """Per (ZeRO stage, offload) of ``combos``, the measured peaks of the fullest rank."""
    script = tmp_path / "engine_bytes.py"
    script.write_text(ENGINE_SCRIPT)
    cmd = (
        [sys.executable, str(script)]
        if world == 1
        else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", str(script)]
    )
    proc = subprocess.run(
        [*cmd, json.dumps(combos), TINY, *model, f"train.precision={precision}"],
        cwd=ROOT,
        env=clean_env(threads=max(1, 2 // world)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = tagged_json(proc.stdout, "ENGINE_BYTES")
    assert len(rows) == len(combos) * world, proc.stdout[-2000:]
    out = {}
    for row in rows:
        best = out.setdefault((row["zero"], row["offload"]), dict(row))
        for key in ("backward", "step", "transient"):
            best[key] = max(best[key], row[key])
    assert list(out) == list(combos), rows  # DeepSpeed's wrapper offloads what the generated JSON asks
    return out


# ZeRO-Offload (ZeRO 1-3) and ZeRO-Infinity's parameter offload (ZeRO-3), measured in the bf16 one-rank run
OFFLOADED = ((1, "optimizer"), (2, "optimizer"), (3, "optimizer"), (3, "optimizer+params"))


@pytest.mark.parametrize(
    "world, precision",
    [(1, "bf16"), pytest.param(2, "bf16", marks=pytest.mark.slow), pytest.param(2, "fp32", marks=pytest.mark.slow)],
)
def test_plan_counts_what_the_deepspeed_engine_allocates(world, precision, tmp_path):
    """Offloaded: on the CPU accelerator the device and the host are one memory, so glm plan's device
    bytes per phase plus its host bytes (master weights, moments, fp32 gradients, staging copies) are
    what the engine holds."""
    shape = model_shape(family("gpt"), model_config(load_config(TINY, TINY_MODEL)))
    combos = ZERO_STAGES + (OFFLOADED if (world, precision) == (1, "bf16") else ())  # one process for all
    for (zero, offload), row in engine_bytes(world, precision, tmp_path, combos=combos).items():
        assert row["optimizer"] == WRAPPERS[precision][max(zero, 2) if offload != "none" else zero]
        assert row["params"] == shape.params
        if zero >= 2:  # the generated JSON's bucket, not DeepSpeed's 5e8-element default
            assert row["bucket_elements"] == zero_buffers(shape.d_model, zero)["reduce_bucket_size"] == 64 * 64
        host = model_state_bytes(shape.params, shape.largest_layer, world, zero, offload, precision)[3]
        assert (host > 0) == (offload != "none")
        backward, step = phase_bytes(
            shape.params, shape.largest_layer, world, zero, offload, precision, d_model=shape.d_model
        )
        assert (backward + host) / row["backward"] == pytest.approx(1, abs=0.1), (zero, offload, backward, host, row)
        assert (step + host) / row["step"] == pytest.approx(1, abs=0.1), (zero, offload, step, host, row)


def test_plan_total_is_the_measured_peak_of_a_bf16_step(tmp_path):
    """The peak of live bytes through two steps (transient copies and activations included) is what
    glm plan reports as the layout's total, at ZeRO 0-2: the flat copies of the step make it."""
    cfg = load_config(TINY, WIDE_MODEL)
    shape = model_shape(family("gpt"), model_config(cfg))
    layouts = plan(shape, gpus=1, seq_len=cfg.data.seq_len, micro_batch=2, global_batch=2)
    for (zero, _), row in engine_bytes(1, "bf16", tmp_path, WIDE_MODEL).items():
        lay = next(lay for lay in layouts if (lay.zero, lay.offload) == (zero, "none"))
        assert lay.step > lay.backward + lay.activations  # the step's copies, not the activations, make the peak
        if zero <= 2:
            assert lay.total(False) / row["transient"] == pytest.approx(1, abs=0.1), (zero, lay.total(False), row)


def test_zero_buffers_follow_the_model_width_up_to_deepspeeds_defaults():
    """Hugging Face's "auto" rule (d^2, 0.9 d^2, 10 d), capped at DeepSpeed's defaults (5e8, 5e7, 1e5)."""
    assert zero_buffers(64, 2) == {"reduce_bucket_size": 4096}
    gpt2_xl = zero_buffers(1600, 3)
    assert gpt2_xl == {
        "reduce_bucket_size": 2_560_000,
        "stage3_prefetch_bucket_size": 2_304_000,
        "stage3_max_reuse_distance": 2_304_000,
        "stage3_param_persistence_threshold": 16_000,
    }
    wide = zero_buffers(25_600, 3)
    assert wide == {
        "reduce_bucket_size": 5 * 10**8,
        "stage3_prefetch_bucket_size": 5 * 10**7,
        "stage3_max_reuse_distance": 5 * 10**7,
        "stage3_param_persistence_threshold": 10**5,
    }


def test_zero2_and_3_on_one_data_parallel_rank_are_marked_and_never_recommended():
    shape = model_shape(
        family("gpt"),
        model_config(
            load_config(TINY, ["model.flavor=gpt2-xl", "model.vocab_size=50257", "model.context_length=1024"])
        ),
    )
    one = plan(shape, gpus=1, seq_len=1024, micro_batch=4, global_batch=4)
    assert {(lay.zero, lay.offload) for lay in one if lay.saves_nothing} == {(2, "none"), (3, "none")}
    assert not any(
        lay.saves_nothing for lay in plan(shape, gpus=2, seq_len=1024, micro_batch=4, global_batch=8) if lay.dp == 2
    )
    zero2 = next(lay for lay in one if (lay.zero, lay.offload) == (2, "none"))
    assert zero2.total(False) < 141 * 0.9 * GB and recommend([zero2], 141) == (None, True)  # fits, never chosen
    best, _ = recommend(one, 141)
    assert best is not None and not best.saves_nothing
