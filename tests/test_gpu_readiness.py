"""What a GPU cluster run needs and the CPU suite can still check: the memory plan of DeepSpeed's
BF16_Optimizer against the bytes a real run holds, MFU's peak table and measurement, the SLURM submit
refusing a job without GPUs, CPU counts that honour affinity, the generated DeepSpeed JSON, attention
masks that leave SDPA its flash kernels, T5's bias cast once, and LAMB without host syncs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from glm_dist.config.checks import model_config
from glm_dist.config.loader import load_config
from glm_dist.families.registry import family
from glm_dist.observability import flops
from glm_dist.observability.flops import matmul_dtype, measure_matmul_peak, mfu_peak, peak_flops
from glm_dist.parallel.plan import GB, model_shape, model_state_bytes, plan, recommend
from tests.conftest import FAST, ROOT, TINY, clean_env


# -- glm plan: DeepSpeed's BF16_Optimizer (bf16 + ZeRO-1) against a real run ----------------------
# Measures the model states twice: just before the optimizer step of every step (the bf16 gradients
# are alive then) and, as glm train writes them, at the end of the run (after the step freed them).
PEAK_SCRIPT = r"""
import json, sys
from pathlib import Path
from glm_dist.config.loader import load_config
from glm_dist.parallel.memory import rank_model_states
from glm_dist.train.loop import Trainer

cfg = load_config(sys.argv[1], sys.argv[2:])
trainer = Trainer(cfg)
optimizer, peak = trainer.engine.optimizer, {"optimizer_class": type(trainer.engine.optimizer).__name__}
step = optimizer.step
def measured_step(*args, **kwargs):
    peak.update(rank_model_states(trainer.engine))
    return step(*args, **kwargs)
optimizer.step = measured_step
trainer.fit()
Path(cfg.train.out_dir, f"peak_rank{trainer.dist.rank}.json").write_text(json.dumps(peak))
"""


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_plan_counts_what_the_bf16_optimizer_holds(nproc, shards_dir, tmp_path):
    """bf16 + ZeRO-1 on 1 and 2 ranks: every rank holds the bf16 weights, the bf16 gradients and the
    whole fp32 accumulation buffer; only the fp32 master and the moments shrink with the ranks."""
    overrides = [
        *FAST,
        f"data.shards_dir={shards_dir}",
        f"train.out_dir={tmp_path}",
        "train.precision=bf16",
        "parallel.zero_stage=1",
        "train.max_steps=2",
        f"train.grad_accum_steps={2 // nproc}",
    ]
    script = tmp_path / "peak.py"
    script.write_text(PEAK_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            str(script),
            TINY,
            *overrides,
        ],
        cwd=ROOT,
        env=clean_env(threads=max(1, 2 // nproc)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    shape = model_shape(family("gpt"), model_config(load_config(TINY, overrides)))
    weights, grads, optimizer, _ = model_state_bytes(shape.params, shape.largest_layer, nproc, 1, "none", "bf16")
    for rank in range(nproc):
        peak = json.loads((tmp_path / f"peak_rank{rank}.json").read_text())
        end = json.loads((tmp_path / f"model_states_rank{rank}.json").read_text())
        assert peak["optimizer_class"] == "BF16_Optimizer"
        # flat buffers are padded to a multiple of 2 x ranks elements: bytes agree to 0.1%
        assert peak["params"] == end["params"] == weights
        assert peak["grads"] == pytest.approx(grads, rel=1e-3)  # bf16 gradients + the whole fp32 buffer
        assert end["grads"] == pytest.approx(grads - 2 * shape.params, rel=1e-3)  # the step freed the bf16 ones
        assert peak["optimizer"] == end["optimizer"] == pytest.approx(optimizer, rel=1e-3)
        if nproc > 1:  # what glm plan assumed before: fp32 gradients split over the ranks
            assert peak["grads"] > 1.4 * (2 * shape.params + 4 * shape.params / nproc)


def test_bf16_zero1_plan_of_the_gpt3_13b_recipe_needs_more_than_an_80_gb_card():
    """The 13B recipe's layout (DP=256, ZeRO-1, bf16) was planned at ~52 GB per GPU; BF16_Optimizer
    makes it ~99 GiB, so glm plan recommends another layout that fits."""
    cfg = load_config(str(ROOT / "configs/experiments/published/gpt3-13b.yaml"))
    shape = model_shape(family("gpt"), model_config(cfg))
    w, g, o, cpu = model_state_bytes(shape.params, shape.largest_layer, 256, 1, "none", "bf16")
    assert (w, g, o, cpu) == (2 * shape.params, 6 * shape.params, 12 * shape.params / 256, 0.0)
    layouts = plan(shape, gpus=256, seq_len=2048, micro_batch=2, global_batch=1024)
    zero1 = next(lay for lay in layouts if (lay.dp, lay.zero, lay.offload) == (256, 1, "none"))
    assert 95 * GB < zero1.total(True) < 105 * GB
    best, ckpt = recommend(layouts, 80, checkpointing=True)
    assert best is not None and best is not zero1 and best.total(ckpt) <= 0.9 * 80 * GB
    assert (cfg.parallel.zero_stage, best.dp) == (best.zero, 256)  # the recipe uses the layout that fits
    # with the optimizer offloaded, ZeRO-1 is DeepSpeed's ZeRO optimizer again, not BF16_Optimizer (6
    # bytes a parameter): its fp32 grad_accum attribute per gradient (grad_accum_dtype fp32), 4 bytes
    assert model_state_bytes(1000, 10, 4, 1, "optimizer", "bf16")[1] == 4000


# -- MFU: the peak table, the measurement, the override -------------------------------------------
@pytest.mark.parametrize(
    "name, bf16, tf32, fp32",
    [
        ("NVIDIA H100 80GB HBM3", 989.4, 494.7, 66.9),
        ("NVIDIA H100 PCIe", 756.0, 378.0, 51.2),
        ("NVIDIA H100 NVL", 835.5, 417.5, 60.0),
        ("NVIDIA H200", 989.4, 494.7, 66.9),
        ("NVIDIA A100-SXM4-40GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100-SXM4-80GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100-PCIE-40GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100 80GB PCIe", 312.0, 156.0, 19.5),
        ("NVIDIA L4", 121.0, 60.0, 30.3),
        ("NVIDIA L40S", 362.05, 183.0, 91.6),
        ("NVIDIA L40", 181.05, 90.5, 90.5),
    ],
)
def test_datasheet_peak_is_the_exact_devices_for_each_precision(name, bf16, tf32, fp32):
    assert peak_flops(name, "bf16") == peak_flops(name, "bf16-autocast") == pytest.approx(bf16 * 1e12)
    assert peak_flops(name, "fp32", tf32=True) == pytest.approx(tf32 * 1e12)
    assert peak_flops(name, "fp32") == pytest.approx(fp32 * 1e12)  # TF32 off: the plain fp32 rate


@pytest.mark.parametrize(
    "name",
    ["NVIDIA H100", "H100 PCIe", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "Tesla T4", "NVIDIA L4 ", "nvidia h200", ""],
)
def test_unknown_or_partial_device_names_have_no_datasheet_peak(name):
    """No substring matching: a MIG slice or an unlisted card falls back to a measurement."""
    assert peak_flops(name, "bf16") is None


def test_unknown_precision_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown precision 'fp16'; expected one of fp32, bf16, bf16-autocast"):
        peak_flops("NVIDIA H200", "fp16")


def test_matmul_peak_is_the_best_of_every_size_and_repeat(monkeypatch):
    """A loaded machine only slows some products down: the fastest one, and its size, is reported."""
    from types import SimpleNamespace

    durations = [
        0.50,
        0.40,
        0.45,  # n=64: 3 repeats
        0.30,
        0.02,
        0.30,
    ]  # n=128: the second product ran undisturbed
    clock = iter(t for d in durations for t in (0.0, d))  # (start, end) of each timed product
    monkeypatch.setattr(flops, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    best = measure_matmul_peak(torch.float32, "cpu", sizes=(64, 128), repeats=3, budget_s=float("inf"))
    assert best.size == 128 and best.flops == pytest.approx(2 * 128**3 / 0.02)
    monkeypatch.undo()
    real = measure_matmul_peak(torch.bfloat16, torch.device("cpu"), sizes=(32, 64), repeats=2)
    assert real.size in (32, 64) and real.flops > 0
    # a size whose products would end past the budget is skipped (8192: ~2 TFLOP per product)
    start = time.perf_counter()
    assert measure_matmul_peak(torch.float32, "cpu", sizes=(64, 8192), repeats=1, budget_s=0.5).size == 64
    assert time.perf_counter() - start < 5
    with pytest.raises(ValueError, match="times CPU and CUDA devices, not 'meta'; set GLM_PEAK_TFLOPS"):
        measure_matmul_peak(torch.float32, "meta")


def test_mfu_peak_uses_the_override_then_the_datasheet_then_a_measurement_on_the_runs_device(monkeypatch):
    measured = []
    monkeypatch.setattr(
        flops,
        "measure_matmul_peak",
        lambda dtype, device: measured.append((dtype, device)) or flops.MatmulPeak(5e12, 4096),
    )
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    monkeypatch.delenv("GLM_PEAK_TFLOPS", raising=False)
    gpu = torch.device("cuda", 1)
    assert mfu_peak(gpu, "bf16", measure=True) == pytest.approx(756e12)
    assert mfu_peak(gpu, "fp32", measure=True) == pytest.approx(51.2e12)  # TF32 off: plain fp32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        assert mfu_peak(gpu, "fp32", measure=True) == pytest.approx(378e12)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    assert measured == []  # a known GPU is never measured
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA RTX PRO 6000")
    assert mfu_peak(gpu, "bf16-autocast", measure=True) == 5e12 and measured == [(torch.bfloat16, gpu)]
    assert mfu_peak(torch.device("cpu"), "fp32", measure=False) is None
    assert mfu_peak(torch.device("cpu"), "fp32", measure=True) == 5e12 and measured[-1] == (
        torch.float32,
        torch.device("cpu"),
    )
    monkeypatch.setenv("GLM_PEAK_TFLOPS", "400")
    assert mfu_peak(gpu, "bf16", measure=True) == 400e12
    monkeypatch.setenv("GLM_PEAK_TFLOPS", "fast")
    with pytest.raises(ValueError, match="GLM_PEAK_TFLOPS='fast' is not a number; set it to the device's peak"):
        mfu_peak(gpu, "bf16", measure=True)
    assert matmul_dtype("fp32") == torch.float32 and matmul_dtype("bf16-autocast") == torch.bfloat16


# -- SLURM: no silent CPU training on a GPU cluster ------------------------------------------------
def submit(capsys, *args: str) -> tuple[int, str, str]:
    from glm_dist.slurm import main

    code = main(["submit", "-c", TINY, "--nodes", "2", "--dry-run", *args])
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


def test_slurm_submit_refuses_a_job_without_gpus_unless_told_cpu(capsys):
    code, out, err = submit(capsys)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("glm slurm submit: error: no GPUs requested: pass --gpus-per-node N") and "--cpu" in err
    code, _, err = submit(capsys, "--cpu", "--gpus-per-node", "4")
    assert code == 2 and "contradict" in err
    code, out, _ = submit(capsys, "--gpus-per-node", "8")
    assert code == 0 and "--gpus-per-node=8 --cpus-per-task=64 " in out  # 8 cores per GPU for the node's task
    code, out, _ = submit(capsys, "--gpus-per-node", "4", "--cpus-per-task", "48")
    assert code == 0 and "--gpus-per-node=4 --cpus-per-task=48 " in out
    code, out, _ = submit(capsys, "--cpu")  # a CPU partition: today's job, no GPU or core request
    assert code == 0 and "--gpus-per-node" not in out and "--cpus-per-task" not in out


def test_train_sbatch_gives_srun_the_cores_and_uses_torchs_nccl_variable():
    text = (ROOT / "slurm/train.sbatch").read_text()
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in text and " NCCL_ASYNC_ERROR_HANDLING" not in text
    assert "${SLURM_CPUS_PER_TASK:+--cpus-per-task=$SLURM_CPUS_PER_TASK}" in text
    # run without GPUs and without GLM_PROCS_PER_NODE, the script stops before srun with one line
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_JOB_ID": "7",
        "GLM_VENV": "/nonexistent",
    }
    proc = subprocess.run(
        ["bash", str(ROOT / "slurm/train.sbatch"), TINY], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("error: no GPUs allocated") and "GLM_PROCS_PER_NODE=N" in proc.stderr


def test_available_cpus_follows_the_affinity_mask():
    """A process bound to one core (SLURM, taskset, a cpuset) counts one CPU, whatever the machine has."""
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from data_pipeline.executors.cpus import available_cpus; print(available_cpus())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr
    from data_pipeline.executors.cpus import available_cpus

    assert available_cpus() == len(os.sched_getaffinity(0))


# -- the generated DeepSpeed JSON ------------------------------------------------------------------
def test_deepspeed_json_overlaps_zero2_3_communication_and_pins_offload_only_on_cuda():
    from glm_dist.config.deepspeed_json import deepspeed_config

    def zero(stage: int, **kw) -> dict:
        over = [f"parallel.zero_stage={stage}", "parallel.offload_optimizer=true"]
        return deepspeed_config(
            load_config(TINY, over + (["parallel.offload_params=true"] if stage == 3 else [])), dp_size=2, **kw
        )["zero_optimization"]

    assert [zero(s)["overlap_comm"] for s in (1, 2, 3)] == [False, True, True]
    assert zero(3, cuda=True)["offload_optimizer"]["pin_memory"] and zero(3, cuda=True)["offload_param"]["pin_memory"]
    assert not zero(3, cuda=False)["offload_param"]["pin_memory"]
    assert zero(2)["offload_optimizer"]["pin_memory"] == torch.cuda.is_available()


# -- attention: masks only where something is masked; T5's bias cast once --------------------------
def sdpa_masks(monkeypatch, module) -> list:
    """Record the attn_mask of every scaled_dot_product_attention call made by ``module``."""
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((attn_mask, q.dtype, q.shape[2]))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(module.F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("window", [None, 3])
def test_gpt_decoding_one_token_attends_without_a_mask_unless_the_window_cuts(window, monkeypatch):
    from glm_dist.models import common
    from glm_dist.families.gpt.model import GPT, gpt_config

    torch.manual_seed(0)
    model = GPT(gpt_config("tiny", n_layer=2, d_model=32, n_head=2, vocab_size=50, sparse_window=window)).eval()
    x = torch.randint(0, 50, (2, 9))
    cache = [{} for _ in model.blocks]
    with torch.no_grad():
        full = model(x)
        calls = sdpa_masks(monkeypatch, common)
        steps = torch.cat([model(x[:, :4], cache)] + [model(x[:, i : i + 1], cache) for i in range(4, 9)], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    one_token = [(i % 2, mask) for i, (mask, _, t) in enumerate(calls) if t == 1]  # (layer, mask); odd: sparse
    assert all(mask is None for layer, mask in one_token if window is None or layer == 0)
    # a sparse layer whose cache (4+ keys) outgrows its window of 3 still needs its band
    assert window is None or all(mask is not None for layer, mask in one_token if layer == 1)


@pytest.mark.parametrize("family", ["bart", "t5"])
def test_seq2seq_incremental_decoding_matches_and_unpadded_cross_attention_takes_no_mask(family, monkeypatch):
    from glm_dist.families.bart import model as bart
    from glm_dist.families.t5 import model as t5

    module = {"bart": bart, "t5": t5}[family]
    cfg = bart.bart_config("bart-tiny", vocab_size=60) if family == "bart" else t5.t5_config("t5-tiny", vocab_size=60)
    torch.manual_seed(0)
    model = (bart.Bart if family == "bart" else t5.T5)(cfg).eval()
    x, dec = torch.randint(3, 60, (2, 7)), torch.randint(3, 60, (2, 6))
    with torch.no_grad():
        full = model(x, dec)["logits"]
        calls = sdpa_masks(monkeypatch, module)
        memory, cache = model.encode(x), [{} for _ in model.decoder.blocks]
        steps = torch.cat(
            [model.decode(dec[:, :3], memory, cache=cache)]
            + [model.decode(dec[:, i : i + 1], memory, cache=cache) for i in range(3, 6)],
            1,
        )
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    decoder_calls = calls[len(model.encoder.blocks) :]
    cross = decoder_calls[1::2]  # each decoder block: self-attention, then cross-attention
    assert all(mask is None for mask, _, _ in cross)  # no padding: nothing to mask
    if family == "bart":  # no position bias: one new token's self-attention is unmasked too
        assert all(mask is None for mask, _, t in decoder_calls[::2] if t == 1)


def test_t5_casts_its_position_bias_once_per_stack_under_autocast(monkeypatch):
    from glm_dist.families.t5 import model as t5

    torch.manual_seed(0)
    model = t5.T5(t5.t5_config("t5-tiny", vocab_size=60, n_layer=3)).eval()
    x, dec = torch.randint(3, 60, (2, 7)), torch.randint(3, 60, (2, 6))
    mask = torch.ones_like(x)
    mask[1, -2:] = 0
    calls = sdpa_masks(monkeypatch, t5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x, dec, attention_mask=mask)
    encoder, decoder_self = [c[0] for c in calls[:3]], [c[0] for c in calls[3::2]]
    for masks in (encoder, decoder_self):  # one tensor shared by the stack's layers, already in bf16
        assert all(m is masks[0] for m in masks) and masks[0].dtype == torch.bfloat16
    assert all(m.dtype == q_dtype for m, q_dtype, _ in calls)


# -- LAMB: the trust ratio stays on the device -----------------------------------------------------
def test_lamb_step_never_reads_a_value_back_to_the_host(monkeypatch):
    from glm_dist.train.optim import Lamb

    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.zeros(3))]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = Lamb(params, lr=0.1, weight_decay=0.01)

    def host_sync(self, *args):
        raise AssertionError("LAMB read a tensor back to the host")

    for name in ("__float__", "item", "__bool__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, host_sync)
    before = [p.detach().clone() for p in params]
    opt.step()
    monkeypatch.undo()
    assert all(not torch.equal(a, p.detach()) for a, p in zip(before, params))


def test_fp32_runs_on_a_gpu_use_tf32_and_nothing_else_changes_it():
    from glm_dist.train.loop import allow_tf32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert not allow_tf32(torch.device("cpu"), "fp32") and not allow_tf32(torch.device("cuda", 0), "bf16")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert allow_tf32(torch.device("cuda", 0), "fp32")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
