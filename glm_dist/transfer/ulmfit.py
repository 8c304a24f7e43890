"""ULMFiT's classifier (Howard & Ruder 2018, section 3.3) on an AWD-LSTM checkpoint: ``glm finetune``'s
third stage, after general-domain LM pretraining and target-task LM fine-tuning (``glm train`` with
``train.init_from``; docs/models.md#ulmfit-awd-lstm).

- BPT3C: a document is read in windows of ``--bptt`` (70) tokens, each window starting from the
  state the previous one ended in (detached: gradients stop at window edges, as truncated BPTT),
  and the last layer's outputs of all windows are kept for pooling over the whole document.
- Concat pooling: h_c = [h_T; maxpool(H); meanpool(H)] over the document's real positions.
- Two linear blocks, each batch norm -> dropout -> linear (ReLU after the first), hidden size 50,
  dropouts 0.4 (the LM's output dropout, as the authors' fastai passes it on) and 0.1; softmax.
  ``--drop-mult`` scales these and the LM's dropouts (fastai's ``drop_mult``; a tiny LM does not
  learn a classifier under the full-size model's 0.65 input dropout).
- The loss adds the LM's AR / TAR over the document's outputs (its ``ar_alpha`` / ``tar_beta``),
  as fastai's classifier does. Adam with beta1 0.7, beta2 0.99 (the paper's).

Discriminative rates, slanted triangular rates and gradual unfreezing come from ``tricks``; their
layer groups are the LM's (embedding, each LSTM layer) and the head on top. It trains through
``glm finetune``'s one loop (transfer/loop.py); ``ConcatPoolTask`` is what differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.families.awd_lstm.model import AwdLstm
from glm_dist.objectives.awd_lm import activation_penalties
from glm_dist.transfer.files import finish, known_label_rows, read_manifest_ids, train_valid_rows
from glm_dist.transfer.inputs import batch_on, batch_rows, pad_ids
from glm_dist.transfer.loop import Batch, finetune_task, fit
from glm_dist.transfer.options import FinetuneArgs, FinetuneError
from glm_dist.transfer.tricks import Tricks


def scale_dropouts(lm: AwdLstm, mult: float) -> None:
    """Every dropout of the LM times ``mult`` (fastai's ``drop_mult``: the classifier's regularisation
    scaled as one knob; the LM's config keeps its own values)."""
    cfg = lm.cfg
    lm.embed.p, lm.input_drop.p = cfg.embed_dropout * mult, cfg.input_dropout * mult
    lm.hidden_drop.p, lm.output_drop.p = cfg.hidden_dropout * mult, cfg.output_dropout * mult
    for rnn in lm.rnns:
        if rnn.rnn is not rnn.lstm:  # WeightDrop
            rnn.rnn.p = cfg.weight_drop * mult


class ConcatPoolClassifier(nn.Module):
    def __init__(self, lm: AwdLstm, num_labels: int, *, hidden: int = 50, bptt: int = 70, drop_mult: float = 1.0):
        super().__init__()
        self.lm, self.bptt = lm, bptt
        scale_dropouts(lm, drop_mult)
        p1, p2 = lm.cfg.output_dropout * drop_mult, 0.1 * drop_mult
        d = 3 * lm.cfg.d_model
        self.head = nn.Sequential(
            nn.BatchNorm1d(d),
            nn.Dropout(p1),
            nn.Linear(d, hidden),
            nn.ReLU(),
            nn.BatchNorm1d(hidden),
            nn.Dropout(p2),
            nn.Linear(hidden, num_labels),
        )

    def read(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """BPT3C: (B, T) right-padded documents -> the last layer's dropped and raw outputs (B, T, d),
        zero at padding, read ``bptt`` tokens at a time with the state carried between windows."""
        B, T = input_ids.shape
        out = input_ids.new_zeros(B, T, self.lm.cfg.d_model, dtype=self.lm.embed.weight.dtype)
        raw = torch.zeros_like(out)
        state = [tuple(out.new_zeros(1, B, d_out) for _ in range(2)) for _, d_out in self.lm.cfg.widths()]
        for start in range(0, T, self.bptt):
            span = (lengths - start).clamp(0, self.bptt)  # (B,) real tokens of each row in this window
            rows = (span > 0).nonzero().squeeze(1)
            if len(rows) == 0:
                break
            width = int(span.max())
            ids = input_ids[rows, start : start + width]
            output, raw_output, new = self.lm.encode(ids, span[rows], [(h[:, rows], c[:, rows]) for h, c in state])
            place = (0, 0, start, T - start - width)  # this window's positions; zero elsewhere (windows do not overlap)
            out = out.index_add(0, rows, F.pad(output, place))
            raw = raw.index_add(0, rows, F.pad(raw_output, place))
            state = [
                (h.index_copy(1, rows, nh.detach()), c.index_copy(1, rows, nc.detach()))
                for (h, c), (nh, nc) in zip(state, new)
            ]
        return out, raw

    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> dict[str, torch.Tensor]:
        """``logits`` (B, K) and the outputs AR / TAR read (``output``, ``raw_output``, ``real``)."""
        out, raw = self.read(input_ids, lengths)
        real = torch.arange(input_ids.shape[1], device=input_ids.device)[None] < lengths[:, None]  # (B, T)
        last = out[torch.arange(len(lengths), device=out.device), lengths - 1]  # h_T
        pooled_max = out.masked_fill(~real[..., None], float("-inf")).amax(1)
        pooled_mean = out.sum(1) / lengths[:, None].to(out.dtype)
        logits = self.head(torch.cat([last, pooled_max, pooled_mean], dim=-1))  # (B, 3d) -> (B, K)
        return {"logits": logits, "output": out, "raw_output": raw, "real": real}

    def loss(self, out: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        cfg = self.lm.cfg
        return F.cross_entropy(out["logits"].float(), labels) + activation_penalties(
            out["output"], out["raw_output"], out["real"], alpha=cfg.ar_alpha, beta=cfg.tar_beta
        )


def encode_documents(
    rows: list[dict], tok: Tokenizer, args: FinetuneArgs, labels: dict[str, int], *, eos: int
) -> tuple[list[list[int]], torch.Tensor]:
    """Rows -> token ids (the text, then <eos> as documents end in the LM's stream; at most
    ``max_len`` tokens) and label indices."""
    for row in rows:
        if args.text_field not in row or args.label_field not in row:
            raise FinetuneError(
                f"row {str(row)[:200]} lacks {args.text_field!r} or {args.label_field!r}; set "
                "--text-field / --label-field"
            )
    enc = tok.encode_batch([str(r[args.text_field]) for r in rows], add_special_tokens=False)
    docs = [(e.ids[: args.max_len - 1] + [eos]) for e in enc]
    return docs, torch.tensor([labels[str(r[args.label_field])] for r in rows])


@torch.no_grad()
def accuracy(model, docs: list[list[int]], labels: torch.Tensor, batch_size: int, pad_id: int, device) -> float:
    model.eval()
    right = 0
    for rows in batch_rows(len(docs), batch_size):
        ids, mask = pad_ids(docs[rows], pad_id)
        logits = model(ids.to(device), mask.sum(1).to(device))["logits"]
        right += int((logits.argmax(-1).cpu() == labels[rows]).sum())
    model.train()
    return right / max(1, len(docs))


@dataclass
class ConcatPoolTask:
    """ULMFiT's classifier for the loop: documents padded per batch, Adam with the paper's betas."""

    model: ConcatPoolClassifier
    docs: list[list[int]]
    labels: torch.Tensor
    valid: tuple[list[list[int]], torch.Tensor] | None
    pad_id: int
    batch_size: int
    adapter_sites: tuple[str, ...] = ()
    optimizer: tuple[str, ...] = ("train.beta1=0.7", "train.beta2=0.99")

    @property
    def backbone(self) -> nn.Module:
        return self.model.lm

    @property
    def head(self) -> nn.Module:
        return self.model.head

    def __len__(self) -> int:
        return len(self.docs)

    def batch(self, rows: list[int], device: torch.device) -> Batch:
        ids, mask = pad_ids([self.docs[j] for j in rows], self.pad_id)
        return batch_on({"input_ids": ids, "lengths": mask.sum(1), "labels": self.labels[rows]}, device)

    def loss(self, engine: nn.Module, batch: Batch) -> torch.Tensor:
        return self.model.loss(engine(batch["input_ids"], batch["lengths"]), batch["labels"])

    def evaluate(self, engine: nn.Module) -> dict:
        if self.valid is None:
            return {}
        return {"valid_accuracy": accuracy(engine, *self.valid, self.batch_size, self.pad_id, engine.device)}


def finetune_ulmfit(args: FinetuneArgs, lm: AwdLstm, meta: dict) -> dict:
    """Fine-tune ULMFiT's classifier on ``args.train`` from an AWD-LSTM checkpoint's LM (loaded)."""
    tok = checkpoint_tokenizer(args.checkpoint)
    ids = read_manifest_ids(tok, meta)
    train_rows, valid_rows = train_valid_rows(args, (args.text_field, args.label_field))
    labels = {name: i for i, name in enumerate(sorted({str(r[args.label_field]) for r in train_rows}))}
    valid_rows = known_label_rows(valid_rows, labels, args)
    train = encode_documents(train_rows, tok, args, labels, eos=ids["eos"])
    valid = encode_documents(valid_rows, tok, args, labels, eos=ids["eos"])
    model = ConcatPoolClassifier(lm, len(labels), bptt=args.bptt, drop_mult=args.drop_mult)
    history, settings = finetune_task(ConcatPoolTask(model, *train, valid, ids["pad"], args.batch_size), args)
    counts = torch.bincount(valid[1], minlength=len(labels))
    return finish(
        args,
        {
            "task": args.task,
            "labels": list(labels),
            "train_examples": len(train_rows),
            "valid_examples": len(valid_rows),
            "majority_baseline": counts.max().item() / max(1, len(valid_rows)),
            "valid_accuracy": history[-1]["valid_accuracy"],
            "history": history,
            "settings": {
                **{k: getattr(args, k) for k in ("lr", "batch_size", "epochs", "bptt", "max_len", "drop_mult")},
                **settings,
            },
            "model": model,
        },
    )


def train_classifier(
    model: ConcatPoolClassifier,
    tricks: Tricks,
    groups: list[dict],
    args: FinetuneArgs,
    train: tuple,
    valid: tuple | None,
    *,
    pad_id: int,
) -> list[dict]:
    """``args.epochs`` epochs with tricks already prepared on ``model`` (bench/ulmfit_ablation.py);
    held-out accuracy after each (``valid`` None: none)."""
    return fit(ConcatPoolTask(model, *train, valid, pad_id, args.batch_size), args, tricks, groups)
