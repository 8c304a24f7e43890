"""Score curves (GPT-3's figures): every metric of every task against the number of in-context
examples k, and against model size over several checkpoints (``glm eval --curve k=0,1,5
--checkpoint A,B,... --tasks ...``).

Each checkpoint is loaded once and scored at every k by lm-eval (``harness.evaluate``: few-shot
examples drawn from the task's training split with lm-eval's fixed seed). The curve goes to
``OUT.json`` (one point per checkpoint, k, task and metric, with its standard error), ``OUT_k.png``
(score vs k, a panel per task) and, with two or more checkpoints, ``OUT_size.png`` (score vs
parameters, a line per k and metric).
"""

from __future__ import annotations

import json
from pathlib import Path

from glm_dist.eval.harness import GlmLM, HarnessError, evaluate, task_manager
from glm_dist.models.common import count_parameters


def parse_curve(spec: str) -> list[int]:
    """``k=0,1,5`` -> [0, 1, 5]."""
    name, _, values = spec.partition("=")
    try:
        ks = sorted({int(v) for v in values.split(",") if v.strip()})
    except ValueError:
        ks = []
    if name.strip() != "k" or not ks or ks[0] < 0:
        raise HarnessError(f"--curve {spec!r}: expected k=K1,K2,... with K >= 0 (e.g. k=0,1,5)")
    return ks


def curve_points(results: dict, *, checkpoint: str, params: int, k: int) -> list[dict]:
    """One point per task and metric (lm-eval's ``none`` filter) of one evaluation."""
    points = []
    for task, metrics in sorted(results["results"].items()):
        for key, value in sorted(metrics.items()):
            metric, _, filt = key.partition(",")
            if filt == "none" and not metric.endswith("_stderr") and isinstance(value, (int, float)):
                stderr = metrics.get(f"{metric}_stderr,none")
                points.append(
                    {
                        "checkpoint": checkpoint,
                        "params": params,
                        "k": k,
                        "task": task,
                        "metric": metric,
                        "value": float(value),
                        "stderr": stderr if isinstance(stderr, (int, float)) else None,
                    }
                )
    return points


def run_curve(
    checkpoints: list[str],
    tasks: list[str],
    ks: list[int],
    *,
    include_path: str | None = None,
    limit: float | None = None,
    batch_size: int = 8,
    out: str = "curve.json",
) -> dict | None:
    manager = task_manager(tasks, include_path)
    path = Path(out)
    curve = {"tasks": tasks, "ks": ks, "limit": limit, "checkpoints": [], "points": []}
    for checkpoint in checkpoints:
        lm = GlmLM(checkpoint, batch_size=batch_size)
        params = count_parameters(lm.model)
        curve["checkpoints"].append({"checkpoint": checkpoint, "params": params})
        for k in ks:
            results = evaluate(lm, tasks, manager, num_fewshot=k, limit=limit)
            if results is None:  # not rank 0
                continue
            curve["points"].extend(curve_points(results, checkpoint=checkpoint, params=params, k=k))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(curve, indent=1))  # what is done so far survives a later failure
        del lm
    if not curve["points"]:
        return None
    curve["plots"] = [str(p) for p in plot_curve(curve, path.with_suffix(""))]
    path.write_text(json.dumps(curve, indent=1))
    return curve


def plot_curve(curve: dict, stem: Path) -> list[Path]:
    """``stem_k.png`` (and ``stem_size.png`` for several checkpoints): a panel per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = curve["tasks"]
    paths = []
    views = [("k", "k (examples in the context)", "checkpoint")]
    if len(curve["checkpoints"]) > 1:
        views.append(("params", "parameters", "k"))
    for x, label, line in views:
        fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), dpi=110, squeeze=False)
        for ax, task in zip(axes[0], tasks):
            mine = [p for p in curve["points"] if p["task"] == task]
            for key in sorted({(p["metric"], p[line]) for p in mine}, key=str):
                rows = sorted((p[x], p["value"], p["stderr"] or 0.0) for p in mine if (p["metric"], p[line]) == key)
                xs, ys, errs = zip(*rows)
                name = f"{key[0]} (k={key[1]})" if line == "k" else f"{key[0]} ({Path(str(key[1])).name})"
                ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=name)
            if x == "params":
                ax.set_xscale("log")
            ax.set_title(task)
            ax.set_xlabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(stem.with_name(f"{stem.name}_{'k' if x == 'k' else 'size'}.png"))
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths
