"""bench/gpu_check.sh: valid bash; its CPU fallback runs every stage with tiny sizes and reports
each in the JSON; a run cut off by its time budget still reports what it finished; without a GPU
(and without the fallback asked for) it stops after saying so."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, clean_env

SCRIPT = ROOT / "bench/gpu_check.sh"
STAGES = ["setup", "env", "unit", "quickstart", "resume", "bench"]


def _run(tmp_path, **env) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out/gpu_check.json"
    proc = subprocess.run(["bash", str(SCRIPT), "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=400, env={**clean_env(2), "PYTHON": sys.executable,
                                            "GLM_GPU_CHECK_WORK": str(tmp_path / "work"), **env})
    return proc, json.loads(out.read_text())


def test_script_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_cpu_fallback_runs_every_stage_and_reports_its_numbers(tmp_path):
    """With GLM_FORCE_COLLECTIVES=1 (the script sets it for the unit tests and the training stages)."""
    proc, report = _run(tmp_path, GLM_GPU_CHECK_CPU="1")
    failed = {name: s for name, s in report["stages"].items() if not s["ok"]}  # with their logs' last lines
    assert proc.returncode == 0, f"{json.dumps(failed, indent=1)[-4000:]}\n{proc.stderr[-2000:]}"
    assert list(report["stages"]) == STAGES and report["ok"]
    stages = report["stages"]
    assert stages["env"]["cuda"] is False and stages["env"]["torch"].startswith("2.")
    assert "passed" in stages["unit"]["summary"] and "failed" not in stages["unit"]["summary"]
    quick, resume = stages["quickstart"], stages["resume"]
    assert quick["steps"] == 3 and quick["last_loss"] < quick["first_loss"] and quick["val_loss"] > 0
    assert resume["resumed_at"] == 3 and resume["steps"] == 5  # stopped with a checkpoint, then resumed
    row = stages["bench"]["rows"]["fp32 (peer: fp32)"]
    assert float(row["glm_tokens_per_s"].replace(",", "")) > 0 and row["ratio"].endswith("x")
    assert all(s["seconds"] <= 90 and not s["timed_out"] for s in stages.values())


def test_a_run_cut_off_by_its_budget_still_reports_what_it_finished(tmp_path):
    proc, report = _run(tmp_path, GLM_GPU_CHECK_CPU="1", GLM_GPU_CHECK_BUDGET_S="15")
    assert proc.returncode != 0 and report["ok"] is False
    stages = report["stages"]
    cut = [name for name, s in stages.items() if s["timed_out"]]
    assert cut, stages  # the stage the budget ran out in, and every later one, are recorded as timed out
    assert list(stages) == STAGES[:len(stages)] and list(stages)[-1] in cut


def test_without_a_gpu_it_stops_after_saying_so(tmp_path):
    proc, report = _run(tmp_path)
    assert proc.returncode == 2
    assert list(report["stages"]) == ["setup", "env"] and report["stages"]["env"]["cuda"] is False
