"""bench/gpu_check.sh: valid bash; its CPU fallback runs every stage with tiny sizes, from a Python
that is itself a venv whose torch its base interpreter lacks (the GPU machine's python3), and reports
each in the JSON; a run cut off by its time budget still reports what it finished; without a GPU (and
without the fallback asked for) it stops after saying so. Its parts: wheels for another Python are
refused; the profile counts each GPU kernel once, by kind; device memory readings reach metrics.jsonl,
the progress bar and W&B, and a CPU run has none."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from bench.gpu_check_env import check_wheels, wheels_not_for
from bench.train_throughput import EventRow, busy_us, device_profile, kernel_kind
from glm_dist.config.loader import load_config
from glm_dist.observability.device_memory import device_memory, memory_postfix
from glm_dist.observability.run_logger import RunLogger
from tests.conftest import ROOT, clean_env

SCRIPT = ROOT / "bench/gpu_check.sh"
STAGES = ["env", "setup", "unit", "quickstart", "resume", "resume_exact", "throughput", "profile", "memory", "bench"]


def _run(tmp_path, python: str = sys.executable, **env) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out/gpu_check.json"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **clean_env(2),
            "PYTHON": python,
            "GLM_GPU_CHECK_WORK": str(tmp_path / "work"),
            # not a wheelhouse/ a developer prepared for the GPU machine
            "GLM_WHEELS_DIR": str(tmp_path / "wheels"),
            **env,
        },
    )
    return proc, json.loads(out.read_text())


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _venv_with_torch_in_its_own_site(root) -> str:
    """Venv A, made from the base interpreter, whose torch (this suite's) is reachable only through
    A's own site-packages -- as on the GPU machine, where python3 is a venv holding torch."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin/python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    Path(purelib, "torch_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    base = subprocess.run([sys._base_executable, "-c", "import torch"], capture_output=True)
    assert base.returncode != 0, "the base interpreter imports torch: the test would not tell venvs apart"
    return str(python)


@pytest.mark.slow
def test_cpu_fallback_runs_every_stage_from_a_venv_inside_a_venv(tmp_path):
    """With GLM_FORCE_COLLECTIVES=1 for the unit tests, the quickstart and the resume. The setup makes
    its environment from venv A's python; every later stage runs in it, the tests' children (cleaned
    environment, no PYTHONPATH) too."""
    python_a = _venv_with_torch_in_its_own_site(tmp_path / "venv_a")
    proc, report = _run(tmp_path, python_a, GLM_GPU_CHECK_CPU="1")
    failed = {name: s for name, s in report["stages"].items() if not s["ok"]}  # with their logs' last lines
    assert proc.returncode == 0, f"{json.dumps(failed, indent=1)[-4000:]}\n{proc.stderr[-2000:]}"
    assert list(report["stages"]) == STAGES and report["ok"]
    stages = report["stages"]
    assert stages["env"]["cuda"] is False and stages["env"]["torch"].startswith("2.")
    made = stages["setup"]
    assert made["python"] == str(tmp_path / "work/venv/bin/python")
    assert made["modules"]["torch"] == torch.__file__  # A's torch, seen from the made venv's clean child
    assert "| stage | ok | s | result |" in proc.stdout  # the summary table
    assert "passed" in stages["unit"]["summary"] and not stages["unit"]["failed"]
    exact = stages["resume_exact"]["summary"]  # bf16 at ZeRO 0-3: collected only (the suite runs them)
    assert "tests collected" in exact and "error" not in exact
    quick, resume = stages["quickstart"], stages["resume"]
    assert quick["steps"] == 3 and quick["last_loss"] < quick["first_loss"] and quick["val_loss"] > 0
    assert "mem_max_allocated_gib" not in quick  # the CPU keeps no allocator peaks: absent, not zero
    assert resume["resumed_at"] == 3 and resume["steps"] == 5  # stopped with a checkpoint, then resumed
    assert list(stages["throughput"]["runs"]) == ["mb2", "mb4"]
    assert all(r["tokens_per_s"] > 0 for r in stages["throughput"]["runs"].values())
    row = stages["bench"]["rows"]["fp32 (peer: fp32)"]
    assert row["tokens_per_s"] > 0 and row["ratio"] > 0
    (mem,) = stages["memory"]["rows"]
    assert mem["zero"] == 3 and mem["states_gib"] > 0 and mem["plan_gib"] > mem["plan_states_gib"] > 0
    assert "peak_gib" not in mem
    profile = stages["profile"]["fp32"]
    assert profile["device"] == "cpu" and profile["kinds_us"]["matmuls (linear, mm, bmm)"] > 0
    assert all(not s["timed_out"] for s in stages.values())


def test_a_run_cut_off_by_its_budget_still_reports_what_it_finished(tmp_path):
    proc, report = _run(tmp_path, GLM_GPU_CHECK_CPU="1", GLM_GPU_CHECK_BUDGET_S="8")
    assert proc.returncode != 0 and report["ok"] is False
    stages = report["stages"]
    cut = [name for name, s in stages.items() if s["timed_out"]]
    assert cut, stages  # the stage the budget ran out in is recorded as timed out
    assert list(stages) == STAGES[: len(stages)] and list(stages)[-1] in cut


def test_without_a_gpu_it_stops_after_saying_so(tmp_path):
    proc, report = _run(tmp_path)
    assert proc.returncode == 2
    assert list(report["stages"]) == ["env"] and report["stages"]["env"]["cuda"] is False


# -- the environment: wheels made for another Python ----------------------------------------------
def test_wheels_for_another_python_are_refused_and_pure_or_stable_abi_ones_kept(tmp_path):
    wheels = [
        "pydantic_core-2.33.2-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "hjson-3.1.0-py3-none-any.whl",
        "six-1.17.0-py2.py3-none-any.whl",
        "zstandard-0.23.0-cp311-cp311-manylinux_2_17_x86_64.whl",
        "protobuf-6.31.1-cp39-abi3-manylinux2014_x86_64.whl",
        "cryptography-45.0.0-cp313-abi3-manylinux_2_34_x86_64.whl",
    ]
    refused = wheels_not_for(wheels, (3, 11))
    assert [r.split(" ")[0] for r in refused] == [wheels[0], wheels[5]]
    assert "for cp312, this Python is 3.11" in refused[0]
    assert [r.split(" ")[0] for r in wheels_not_for(wheels, (3, 12))] == [wheels[3], wheels[5]]
    (tmp_path / wheels[0]).touch()
    with pytest.raises(
        SystemExit, match=r"prepared for Python \?, this one is 3.11 .*GLM_GPU_CHECK_PYTHON_VERSION=3.11"
    ):
        check_wheels(tmp_path, (3, 11))
    (tmp_path / wheels[0]).unlink()
    (tmp_path / "prepared.json").write_text('{"python": "3.12"}')  # pure wheels only, but made for 3.12
    with pytest.raises(SystemExit, match="prepared for Python 3.12, this one is 3.11"):
        check_wheels(tmp_path, (3, 11))
    check_wheels(tmp_path, (3, 12))


# -- the profile: device-only accounting ----------------------------------------------------------
def test_device_profile_counts_each_kernel_once_and_leaves_cpu_rows_out():
    """A CPU operator's row spans its kernels (its self device time is theirs again): it is not
    counted; two streams' overlapping kernels count once in the busy time; idle is the rest of the wall."""
    rows = [
        EventRow("aten::mm", False, 0, 400),
        EventRow("aten::addmm", False, 400, 500),
        EventRow("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", True, 10, 110),
        EventRow("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", True, 120, 220),
        EventRow("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", True, 220, 260),
        EventRow("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True, 200, 250),
        EventRow("Memcpy HtoD (Pinned -> Device)", True, 300, 310),
    ]
    out = device_profile(rows, wall_us=500.0)
    assert out["kinds_us"] == {
        "memcpy": 10,
        "communication": 50,
        "attention": 40,
        "optimizer": 0,
        "gemm": 200,
        "reduction": 0,
        "elementwise / cast": 0,
        "other": 0,
    }
    assert out["kernel_us"] == 300  # the CPU rows' 500 us are not added
    assert out["busy_us"] == 100 + 140 + 10  # [10,110] + [120,260] (NCCL inside it) + [300,310]
    assert out["idle_share"] == pytest.approx(1 - 250 / 500)
    assert set(out["top_us"]) == {r.name for r in rows if r.on_device}


@pytest.mark.parametrize(
    "name, kind",
    [
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)", "attention"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64", "attention"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
            "optimizer",
        ),
        ("void multi_tensor_apply_kernel<TensorListMetadata<1>, LpNormFunctor<float>>", "optimizer"),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "gemm"),
        ("triton_tem_fused_mm_0", "gemm"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>", "reduction"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>", "reduction"),
        ("triton_red_fused__to_copy_native_layer_norm_1", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise / cast"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "elementwise / cast"),
        ("triton_poi_fused_gelu_2", "elementwise / cast"),
        ("Memset (Device)", "memcpy"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", "communication"),
        (
            "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>",
            "elementwise / cast",
        ),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>", "reduction"),
        ("void some_new_kernel<float>", "other"),
    ],
)
def test_kernel_names_fall_into_their_kinds(name, kind):
    assert kernel_kind(name) == kind


def test_busy_time_is_the_union_of_intervals():
    assert busy_us([(0, 10), (5, 15), (20, 30), (22, 25)]) == 25
    assert busy_us([]) == 0


# -- device memory in the metrics -----------------------------------------------------------------
def test_the_cpu_has_no_device_memory_reading():
    assert device_memory(torch.device("cpu")) is None and device_memory("cpu") is None
    assert memory_postfix({"loss": 1.0, "tokens_per_s": 10.0}) == {}


class _Recorder:  # a W&B run's log()
    def __init__(self):
        self.logged = []

    def log(self, row, step):
        self.logged.append((step, row))


def test_memory_readings_reach_metrics_the_progress_bar_and_wandb(tmp_path):
    """A log line's reading is written to metrics.jsonl, shown on the bar until the next one, and
    sent to W&B under memory/; a row without one writes no memory keys."""
    cfg = load_config(
        None,
        [
            f"train.out_dir={tmp_path}",
            "logging.log_interval=2",
            "logging.wandb=false",
            "logging.progress=true",
            "train.max_steps=4",
        ],
    )
    log = RunLogger(cfg, is_main=True, start_step=0)
    log.wandb_run = _Recorder()
    reading = {"mem_max_allocated_gib": 12.34, "mem_max_reserved_gib": 15.0, "mem_alloc_retries": 2}
    log.train_step(1, {"loss": 2.0, "tokens_per_s": 100.0})
    log.train_step(2, {"loss": 1.9, "tokens_per_s": 100.0, **reading})
    log.train_step(3, {"loss": 1.8, "tokens_per_s": 100.0})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(set(r) & set(reading)) for r in rows] == [[], sorted(reading), []]
    assert rows[1]["mem_max_allocated_gib"] == 12.34
    assert "mem=12.3/15.0G, retries=2" in log.bar.postfix  # still shown at step 3
    ((step, logged),) = log.wandb_run.logged
    assert step == 2 and logged["memory/max_allocated_gib"] == 12.34 and logged["memory/alloc_retries"] == 2
    assert logged["train/loss"] == 1.9 and "train/mem_max_allocated_gib" not in logged
    log.bar.close()
