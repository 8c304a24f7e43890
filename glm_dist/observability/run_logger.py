"""Rank-0 run logging: ``metrics.jsonl`` (every step), a progress bar, and Weights & Biases.

W&B is offline unless an API key is set (``logging.wandb_mode: auto``); the run id is kept in
``<out_dir>/wandb_run_id`` so a resumed job continues the same W&B run.
"""
from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

from glm_dist.config.loader import to_dict
from glm_dist.config.schema import Config


class RunLogger:
    def __init__(self, cfg: Config, *, is_main: bool, start_step: int, attachments: dict | None = None):
        self.cfg, self.is_main = cfg, is_main
        self.out_dir = Path(cfg.train.out_dir)
        self.metrics_file = self.out_dir / "metrics.jsonl"
        self.bar = self.wandb_run = None
        if not is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        if cfg.logging.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=cfg.train.max_steps, initial=start_step, desc="train", unit="step",
                            dynamic_ncols=True, file=sys.stderr)
        if cfg.logging.wandb:
            self.wandb_run = self._init_wandb(attachments or {})

    def _truncate_after(self, start_step: int) -> None:
        """A resumed run drops the lines a crashed run wrote after its last checkpoint (a train row's
        step counts steps done; validation at ``start_step`` is run again on resume)."""
        if self.metrics_file.exists():
            rows = [(line, json.loads(line)) for line in self.metrics_file.read_text().splitlines() if line.strip()]
            keep = [line for line, row in rows
                    if row["step"] < start_step or (row["step"] == start_step and row["kind"] == "train")]
            self.metrics_file.write_text("".join(line + "\n" for line in keep))

    def _init_wandb(self, attachments: dict):
        import wandb

        lc = self.cfg.logging
        mode = lc.wandb_mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        id_file = self.out_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
        id_file.write_text(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(project=lc.project, entity=lc.entity, name=lc.run_name or self.out_dir.name,
                         group=lc.group, tags=list(lc.tags), dir=str(self.out_dir), id=run_id,
                         resume="allow", mode=mode, config=to_dict(self.cfg))
        for name, payload in attachments.items():  # e.g. the data manifest
            path = self.out_dir / name
            path.write_text(json.dumps(payload, indent=2))
            run.save(str(path), base_path=str(self.out_dir), policy="now")
        return run

    def _append(self, row: dict) -> None:
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def train_step(self, step: int, metrics: dict) -> None:
        """``step`` is the number of optimizer steps done (1-based)."""
        if not self.is_main:
            return
        self._append({"kind": "train", "step": step, **metrics})
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}",
                                 refresh=False)
        if step % self.cfg.logging.log_interval == 0 and self.wandb_run is not None:
            self.wandb_run.log({f"train/{k}": v for k, v in metrics.items()}, step=step)

    def validation(self, step: int, metrics: dict) -> None:
        if not self.is_main:
            return
        self._append({"kind": "val", "step": step, **{f"val_{k}": v for k, v in metrics.items()}})
        extra = "".join(f", {k.replace('_', ' ')} {metrics[k]:.4f}" for k in
                        ("bits_per_byte", "accuracy", "sentence_accuracy", "replaced_accuracy") if k in metrics)
        self.message(f"step {step}: validation loss {metrics['loss']:.4f}, perplexity {metrics['perplexity']:.2f}{extra}")
        if self.wandb_run is not None:
            self.wandb_run.log({f"val/{k}": v for k, v in metrics.items()}, step=step)

    def message(self, text: str) -> None:
        if not self.is_main:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self, summary: dict | None = None) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            for key, value in (summary or {}).items():
                self.wandb_run.summary[key] = value
            self.wandb_run.finish()
