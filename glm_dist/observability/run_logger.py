"""Rank-0 run logging: ``metrics.jsonl`` (every step), a progress bar, and Weights & Biases.

A train row at a log line (``logging.log_interval``) on a GPU also carries the device memory
readings of ``device_memory.py``; the progress bar keeps showing the latest ones. A data mixture's
rows also carry each source's tokens and epochs drawn, its train loss at log lines (``loss/<source>``)
and its validation metrics (``val_<metric>/<source>``, beside the mixture's); the run keeps a data
card of its sources (``data_card.json``).

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
from glm_dist.observability.device_memory import memory_postfix, wandb_key
from glm_dist.observability.redact import redact, redact_text


class RunLogger:
    def __init__(self, cfg: Config, *, is_main: bool, start_step: int, attachments: dict | None = None):
        self.cfg, self.is_main = cfg, is_main
        self.out_dir = Path(cfg.train.out_dir)
        self.metrics_file = self.out_dir / "metrics.jsonl"
        self.bar = self.wandb_run = None
        self.memory_postfix: dict[str, str] = {}  # the latest device memory reading, for the bar
        if not is_main:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._truncate_after(start_step)
        if cfg.logging.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=cfg.train.max_steps,
                initial=start_step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
                file=sys.stderr,
            )
        if cfg.logging.wandb:
            self.wandb_run = self._init_wandb(attachments or {})

    def _truncate_after(self, start_step: int) -> None:
        """A resumed run drops the lines a crashed run wrote after its last checkpoint (a train row's
        step counts steps done; validation at ``start_step`` is run again on resume)."""
        if self.metrics_file.exists():
            rows = []
            for n, line in enumerate(self.metrics_file.read_text(errors="replace").splitlines(), 1):
                try:
                    row = json.loads(line) if line.strip() else None
                except json.JSONDecodeError:  # a crash mid-append leaves a partial last line
                    row = None
                    self.message(
                        f"warning: {self.metrics_file}:{n} is not a complete JSON row (a crash mid-write?); dropped"
                    )
                if isinstance(row, dict) and isinstance(row.get("step"), int):
                    rows.append((line, row))
            keep = [
                line
                for line, row in rows  # (in-loop task scores at start_step are not run again)
                if row["step"] < start_step or (row["step"] == start_step and row.get("kind") in ("train", "tasks"))
            ]
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
        argv, sys.argv = sys.argv, redact(sys.argv)  # W&B records the command line with the run
        try:
            run = wandb.init(
                project=lc.project,
                entity=lc.entity,
                name=redact(lc.run_name or self.out_dir.name),
                group=redact(lc.group),
                tags=redact(list(lc.tags)),
                dir=str(self.out_dir),
                id=run_id,
                resume="allow",
                mode=mode,
                config=redact(to_dict(self.cfg)),
            )
        finally:
            sys.argv = argv
        for name, payload in attachments.items():  # e.g. the data manifest
            path = self.out_dir / name
            path.write_text(json.dumps(redact(payload), indent=2))
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
        self.memory_postfix = memory_postfix(metrics) or self.memory_postfix
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(
                loss=f"{metrics['loss']:.4f}",
                tok_s=f"{metrics['tokens_per_s']:.0f}",
                **self.memory_postfix,
                refresh=False,
            )
        if step % self.cfg.logging.log_interval == 0 and self.wandb_run is not None:
            self.wandb_run.log({wandb_key(k): v for k, v in metrics.items()}, step=step)

    def validation(self, step: int, metrics: dict) -> None:
        if not self.is_main:
            return
        self._append({"kind": "val", "step": step, **{f"val_{k}": v for k, v in metrics.items()}})
        extra = "".join(
            f", {k.replace('_', ' ')} {metrics[k]:.4f}"
            for k in ("bits_per_byte", "accuracy", "sentence_accuracy", "replaced_accuracy")
            if k in metrics
        )
        # no perplexity where the loss is no likelihood (GloVe's least squares reports none)
        ppl_text = f", perplexity {metrics['perplexity']:.2f}" if "perplexity" in metrics else ""
        sources = "; ".join(f"{k[len('loss/') :]} {v:.4f}" for k, v in metrics.items() if k.startswith("loss/"))
        self.message(
            f"step {step}: validation loss {metrics['loss']:.4f}{ppl_text}{extra}"
            + (f" (the mixture's; per source: {sources})" if sources else "")
        )
        if self.wandb_run is not None:
            self.wandb_run.log({f"val/{k}": v for k, v in metrics.items()}, step=step)

    def data(self, step: int, counts: dict) -> None:
        """The data reads of all ranks so far (``data`` row, W&B's ``data/...``), logged at validation;
        documents that could not be read are named in the log."""
        if not self.is_main:
            return
        self._append({"kind": "data", "step": step, **counts})
        if counts.get("skipped_documents") or counts.get("skipped_shards"):
            self.message(
                f"step {step}: data: {counts['skipped_documents']} document read(s) failed after retries "
                f"on all ranks so far (their tokens padded), {counts['skipped_shards']} shard(s) skipped; "
                f"each rank's log names the shards"
            )
        if self.wandb_run is not None:
            self.wandb_run.log({f"data/{k}": v for k, v in counts.items()}, step=step)

    def data_card(self, card: dict) -> None:
        """The run's data card, ``<out_dir>/data_card.json`` (a mixture's sources: what each holds, its
        weight, the tokens the run has drawn from it and the epochs that makes), rewritten at each
        checkpoint; in W&B the file and the summary's ``data/tokens/<source>`` and ``data/epochs/<source>``."""
        if not self.is_main:
            return
        path = self.out_dir / "data_card.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(redact(card), indent=2) + "\n")
        tmp.replace(path)  # a reader never sees half a card
        if self.wandb_run is not None:
            self.wandb_run.save(str(path), base_path=str(self.out_dir), policy="live")
            for source in card["sources"]:
                for key in ("tokens", "epochs"):
                    self.wandb_run.summary[f"data/{key}/{source['name']}"] = source[key]

    def tasks(self, step: int, metrics: dict | None) -> None:
        """An in-loop lm-eval evaluation (``eval/in_loop.py``): a ``tasks`` row and W&B's ``tasks/...``."""
        if not self.is_main or metrics is None:
            return
        self._append({"kind": "tasks", "step": step, **metrics})
        scores = ", ".join(
            f"{k} {v:.4f}" for k, v in metrics.items() if "/" in k and "stderr" not in k and not k.endswith("/ranks")
        )
        self.message(f"step {step}: {scores} ({metrics['seconds']:.1f} s)")
        if self.wandb_run is not None:
            self.wandb_run.log({f"tasks/{k}": v for k, v in metrics.items()}, step=step)

    def message(self, text: str) -> None:
        if not self.is_main:
            return
        text = redact_text(text)  # a message may quote a location from the config
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self, summary: dict | None = None) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.wandb_run is not None:
            for key, value in (summary or {}).items():
                self.wandb_run.summary[key] = redact(value)
            self.wandb_run.finish()
