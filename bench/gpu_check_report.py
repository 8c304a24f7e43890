"""bench/gpu_check.sh's results: each stage's numbers read from its log and files, the JSON rewritten
after every stage, and the summary table at the end. Standard library only: it runs before the
check's environment exists.

    python3 bench/gpu_check_report.py stage OUT_JSON NAME RC SECONDS LOG WORK   # exit: the stage's status
    python3 bench/gpu_check_report.py summary OUT_JSON

A stage's parser may fail a stage whose command exited 0: the resume that did not resume, or memory
readings missing from a GPU run's metrics (or present in a CPU run's).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

MEMORY_KEYS = ("mem_max_allocated_gib", "mem_max_reserved_gib", "mem_alloc_retries")


class StageFailed(Exception):
    """The command ran, but what it left says the stage did not do its job."""


def _rows(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row.get("kind") == kind]


def _median_second_half(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows[len(rows) // 2 :] if r.get(key) is not None]
    return statistics.median(values) if values else None


def _memory(rows: list[dict], cuda: bool) -> dict:
    """The run's largest memory readings; on CUDA they must be there, on the CPU they must not."""
    read = [r for r in rows if "mem_max_allocated_gib" in r]
    if cuda and not read:
        raise StageFailed("no train row carries the device memory readings (mem_max_allocated_gib ...)")
    if not cuda and read:
        raise StageFailed(f"a CPU run's train rows carry device memory readings: {read[0]}")
    return {k: max(r[k] for r in read) for k in MEMORY_KEYS} if read else {}


def env(log: Path, work: Path, cuda: bool) -> dict:
    return json.loads(log.read_text().splitlines()[-1])


def setup(log: Path, work: Path, cuda: bool) -> dict:
    found = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"python"')]
    installed = re.findall(r"^Successfully installed (.*)$", log.read_text(), re.MULTILINE)
    return {**(found[-1] if found else {}), "installed": installed[-1].split() if installed else []}


def pytest(log: Path, work: Path, cuda: bool) -> dict:
    text = log.read_text(errors="replace")
    summary = [
        line.strip("= \n")
        for line in text.splitlines()
        if re.search(r"\d+ (passed|failed|errors?|selected|tests? collected)", line)
    ]
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)
    return {"summary": summary[-1] if summary else None, "failed": failed}


def quickstart(log: Path, work: Path, cuda: bool) -> dict:
    train, val = _rows(work / "quickstart"), _rows(work / "quickstart", "val")
    return {
        "steps": len(train),
        "first_loss": train[0]["loss"],
        "last_loss": train[-1]["loss"],
        "tokens_per_s": _median_second_half(train, "tokens_per_s"),
        "mfu": _median_second_half(train, "mfu"),
        "val_loss": val[-1]["val_loss"] if val else None,
        **_memory(train, cuda),
    }


def resume(log: Path, work: Path, cuda: bool) -> dict:
    found = re.search(r"resumed from \S+ at step (\d+)", log.read_text())
    if not found:
        raise StageFailed("the run did not say 'resumed from ... at step N'")
    train = _rows(work / "quickstart")
    return {"resumed_at": int(found.group(1)), "steps": len(train), "last_loss": train[-1]["loss"]}


def throughput(log: Path, work: Path, cuda: bool) -> dict:
    """The trainer's runs at each micro-batch (``throughput_mbN``): tokens/s and MFU of the second half."""
    out = {}
    for run in sorted(work.glob("throughput_mb*"), key=lambda p: int(p.name[len("throughput_mb") :])):
        train = _rows(run)
        out[run.name[len("throughput_") :]] = {
            "steps": len(train),
            "tokens_per_s": _median_second_half(train, "tokens_per_s"),
            "mfu": _median_second_half(train, "mfu"),
            **_memory(train, cuda),
        }
    if not out:
        raise StageFailed(f"no throughput_mb* run under {work}")
    return {"runs": out}


def bench(log: Path, work: Path, cuda: bool) -> dict:
    return json.loads((work / "bench.json").read_text())


def memory(log: Path, work: Path, cuda: bool) -> dict:
    report = json.loads((work / "memory.json").read_text())
    over = [f"{r['flavor']} ZeRO-{r['zero']}" for r in report["rows"] if r.get("plan_holds") is False]
    if over:
        raise StageFailed(f"measured peak above what glm plan's 90% headroom covers: {', '.join(over)}")
    return report


def profile(log: Path, work: Path, cuda: bool) -> dict:
    return json.loads((work / "profile.json").read_text())["profile"]


# each stage's parser, by the stage's name
PARSERS = {
    "setup": setup,
    "env": env,
    "unit": pytest,
    "quickstart": quickstart,
    "resume": resume,
    "resume_exact": pytest,
    "throughput": throughput,
    "bench": bench,
    "memory": memory,
    "profile": profile,
}


def record(out_json: Path, name: str, rc: int, seconds: float, log: Path, metrics: dict) -> None:
    """Add stage ``name`` to ``out_json``, rewritten whole (a run cut off keeps what it finished)."""
    try:
        out = json.loads(out_json.read_text())
    except (OSError, ValueError):
        out = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "stages": {}}
    tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
    out["stages"][name] = {
        "ok": rc == 0,
        "rc": rc,
        "timed_out": rc in (124, 137),
        "seconds": seconds,
        **metrics,
        "log_tail": tail,
    }
    out["ok"] = all(s["ok"] for s in out["stages"].values())
    out_json.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_json.with_name(out_json.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    os.replace(tmp, out_json)


def stage(out_json: Path, name: str, rc: int, seconds: float, log: Path, work: Path) -> int:
    """Read stage ``name``'s numbers, record them, and return its status: the command's, or 1 when
    its parser fails it."""
    parser = PARSERS[name]
    try:
        report = json.loads(out_json.read_text())
        cuda = bool(report["stages"].get("env", {}).get("cuda"))
    except (OSError, ValueError):
        cuda = False
    metrics: dict = {}
    if rc not in (124, 137):
        try:
            metrics = parser(log, work, cuda)
        except StageFailed as err:
            metrics, rc = {"failed_check": str(err)}, rc or 1
        except (OSError, ValueError, KeyError, IndexError) as err:  # what it should have left is not there
            metrics, rc = {"failed_check": f"{type(err).__name__}: {err}"}, rc or 1
    record(out_json, name, rc, seconds, log, metrics)
    return rc


def _pct(x) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) else "-"


def _num(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "-"


def _gib(row: dict) -> str:
    if "mem_max_allocated_gib" not in row:
        return ""
    return (
        f", peak {row['mem_max_allocated_gib']:.1f} GiB allocated / {row['mem_max_reserved_gib']:.1f} reserved, "
        f"{row['mem_alloc_retries']} retries"
    )


def result_text(name: str, s: dict) -> str:
    """One cell of the summary: the stage's numbers, or why it failed."""
    if s.get("failed_check"):
        return f"check failed: {s['failed_check']}"[:200]
    if s.get("timed_out"):
        return "timed out (stage limit or the check's budget)"
    if name == "setup":
        return (
            f"torch {s.get('modules', {}).get('torch', '?')}; "
            f"installed: {' '.join(s.get('installed', [])) or 'nothing'}"
        )
    if name == "env":
        return f"{s.get('device')}, torch {s.get('torch')}, CUDA {s.get('cuda_version')}"
    if "summary" in s:
        return (s["summary"] or "no pytest summary") + (
            f"; failed: {', '.join(s['failed'][:5])}" if s.get("failed") else ""
        )
    if name == "quickstart" and "steps" in s:
        return (
            f"{s['steps']} steps, loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, val {s['val_loss']:.3f}, "
            f"{_num(s['tokens_per_s'])} tok/s, MFU {_pct(s['mfu'])}{_gib(s)}"
        )
    if name == "resume" and "resumed_at" in s:
        return f"resumed at step {s['resumed_at']}, {s['steps']} steps in all, last loss {s['last_loss']:.3f}"
    if name == "throughput" and "runs" in s:
        return "; ".join(
            f"{mb}: {_num(r['tokens_per_s'])} tok/s, MFU {_pct(r['mfu'])}{_gib(r)}" for mb, r in s["runs"].items()
        )
    if name == "bench" and "rows" in s:
        return "; ".join(
            f"{label}: {_num(r['tokens_per_s'])} vs {_num(r['transformers_tokens_per_s'])} tok/s "
            f"({r['ratio']:.2f}x), MFU {_pct(r['mfu_ours_reference'])} of the reference peak"
            for label, r in s["rows"].items()
        )
    if name == "memory" and "rows" in s:
        return "; ".join(
            f"{r['flavor']} Z{r['zero']}: "
            + (
                f"{r['peak_gib']:.1f}/{r['plan_gib']:.1f} GiB ({r['peak_gib'] / r['plan_gib']:.2f})"
                if r.get("peak_gib") is not None
                else f"states {r['states_gib']:.3f}/{r['plan_states_gib']:.3f} GiB"
            )
            for r in s["rows"]
        )
    if name == "profile":
        parts = []
        for mode, p in s.items():
            if not isinstance(p, dict) or "kinds_us" not in p:
                continue
            total = sum(p["kinds_us"].values()) or 1
            kinds = ", ".join(
                f"{k} {v / total:.0%}" for k, v in sorted(p["kinds_us"].items(), key=lambda kv: -kv[1])[:5]
            )
            idle = f"; GPU idle {p['idle_share']:.1%} of the step" if p.get("idle_share") is not None else ""
            parts.append(f"{mode} ({p['device']}, {p['wall_s_per_step']:.3f} s/step): {kinds}{idle}")
        return "; ".join(parts)
    return ""


def summary(out_json: Path) -> str:
    report = json.loads(out_json.read_text())
    lines = [
        f"gpu_check {'passed' if report['ok'] else 'FAILED'} ({out_json})",
        "",
        "| stage | ok | s | result |",
        "|---|---|---:|---|",
    ]
    for name, s in report["stages"].items():
        lines.append(
            f"| {name} | {'yes' if s['ok'] else 'NO (rc ' + str(s['rc']) + ')'} | {s['seconds']:.0f} | "
            f"{result_text(name, s)} |"
        )
    return "\n".join(lines)


def main() -> None:
    command, out_json = sys.argv[1], Path(sys.argv[2])
    if command == "stage":
        name, rc, seconds, log, work = (
            sys.argv[3],
            int(sys.argv[4]),
            float(sys.argv[5]),
            Path(sys.argv[6]),
            Path(sys.argv[7]),
        )
        sys.exit(stage(out_json, name, rc, seconds, log, work))
    if command == "summary":
        print(summary(out_json))
        return
    sys.exit(f"usage: {sys.argv[0]} stage OUT_JSON NAME RC SECONDS LOG WORK | summary OUT_JSON")


if __name__ == "__main__":
    main()
