"""Encoder family pretraining on the embedded corpus under torchrun with ZeRO-2: loss down, MLM accuracy
up (BERT's losses equal one process's step by step); the checkpoint exports to transformers."""

from __future__ import annotations

import json

import pytest
import torch

from glm_dist.hf.export import export_checkpoint
from tests.conftest import ROOT, run_glm

pytestmark = pytest.mark.slow
QUICK = [
    "train.max_steps=40",
    "train.eval_interval=0",
    "train.eval_batches=4",
    "train.micro_batch_size=16",
    "data.seq_len=64",
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.precision=fp32",
    "data.vocab_size=2048",
    "model.vocab_size=2048",
    "train.warmup_steps=4",
]


def experiment(name: str) -> str:
    return str(ROOT / f"configs/experiments/{name}-tiny-cpu.yaml")


def summary(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.fixture(scope="module")
def encoder_shards(corpus, tmp_path_factory):
    shards = {p: str(tmp_path_factory.mktemp(f"enc-{p}")) for p in ("bert", "roberta", "albert")}
    return {**shards, "electra": shards["bert"]}  # ELECTRA uses BERT's WordPiece vocabulary


def assert_pretrained(proc, family: str) -> None:
    """Loss down, MLM accuracy far above chance, and each family's second objective learnt."""
    s = summary(proc)
    assert s["val_loss"] < s["val_loss_before"] - 1.0
    assert s["val_accuracy"] > 0.03  # chance is 1/vocab (~0.0003); one clean-clone run measured 0.048
    assert "validation perplexity" in proc.stderr
    if family in ("bert", "albert"):
        assert 0.3 < s["val_sentence_accuracy"] < 1.0  # NSP / SOP evaluated on held-out pairs
    if family == "electra":  # the discriminator learns to spot the generator's replacements
        assert s["val_replaced_accuracy"] > 0.7


@pytest.mark.parametrize("family", ["roberta", "albert", "electra"])  # BERT: the test below
def test_tiny_encoder_pretraining_under_zero2_lowers_the_loss_and_raises_mlm_accuracy(
    family, corpus, encoder_shards, tmp_path
):
    out = run_glm(
        [
            "train",
            "-c",
            experiment(family),
            *QUICK,
            f"data.source={corpus}",
            "parallel.zero_stage=2",
            f"data.shards_dir={encoder_shards[family]}",
            f"train.out_dir={tmp_path}",
        ],
        nproc=2,
    )
    assert "world size 2, ZeRO-2" in out.stderr
    assert_pretrained(out, family)


def test_bert_under_torchrun_with_zero2_and_exported_to_transformers(corpus, encoder_shards, tmp_path):
    common = [
        "train",
        "-c",
        experiment("bert"),
        *QUICK,
        f"data.source={corpus}",
        f"data.shards_dir={encoder_shards['bert']}",
    ]
    run_glm([*common, f"train.out_dir={tmp_path / 'one'}", "train.grad_accum_steps=2", "parallel.zero_stage=2"])
    two = run_glm([*common, f"train.out_dir={tmp_path / 'two'}", "parallel.zero_stage=2"], nproc=2)
    assert "world size 2, ZeRO-2" in two.stderr
    losses = [
        [
            json.loads(r)["loss"]
            for r in (tmp_path / d / "metrics.jsonl").read_text().splitlines()
            if json.loads(r)["kind"] == "train"
        ]
        for d in ("one", "two")
    ]
    assert max(abs(a - b) for a, b in zip(*losses)) < 1e-4  # same global batch, same losses
    assert summary(two)["val_loss"] < summary(two)["val_loss_before"] - 1.5
    assert_pretrained(two, "bert")

    from transformers import AutoTokenizer, BertForPreTraining

    export_checkpoint(tmp_path / "two/checkpoints/step_00000040", tmp_path / "hf")  # what glm export-hf runs
    model = BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tok("return the number of items.", "hello world!", return_tensors="pt")
    assert enc.input_ids[0, 0] == tok.cls_token_id and tok.mask_token == "[MASK]"
    from glm_dist.eval.run import load_checkpoint_model

    ours, _ = load_checkpoint_model(tmp_path / "two/checkpoints/step_00000040")
    with torch.no_grad():
        theirs = model(**enc).prediction_logits
        mine = ours(enc.input_ids, token_type_ids=enc.token_type_ids, attention_mask=enc.attention_mask)["logits"]
    assert (theirs - mine).abs().max().item() < 1e-4


def test_finetune_classifies_stdlib_docstrings_by_module_well_above_the_majority_baseline(
    corpus, encoder_shards, docstring_task, tmp_path
):
    run_glm(
        [
            "train",
            "-c",
            experiment("bert"),
            *QUICK,
            "train.max_steps=60",
            f"data.source={corpus}",
            f"data.shards_dir={encoder_shards['bert']}",
            f"train.out_dir={tmp_path / 'pre'}",
        ]
    )
    out = run_glm(
        [
            "finetune",
            "--checkpoint",
            str(tmp_path / "pre/checkpoints/step_00000060"),
            "--train",
            docstring_task,
            "--epochs",
            "8",
            "--lr",
            "1e-3",
            "--out",
            str(tmp_path / "ft"),
        ]
    )
    result = json.loads(out.stdout[out.stdout.index("{") :])
    assert result["labels"] == ["calendar", "math", "shutil", "tarfile", "urllib.parse"]
    assert result["valid_examples"] >= 40
    assert result["valid_accuracy"] >= result["majority_baseline"] + 0.1, result  # one clean-clone run measured +0.14
    assert (tmp_path / "ft/finetune.json").exists() and (tmp_path / "ft/model.safetensors").exists()


def test_span_head_scores_start_and_end_with_two_vectors_and_ignores_padding():
    from glm_dist.families.bert.model import Encoder, encoder_config
    from glm_dist.models.heads import SequenceClassifier, SpanExtractor

    enc = Encoder(encoder_config("bert-tiny", vocab_size=100))
    span = SpanExtractor(enc)
    ids = torch.randint(5, 100, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    start, end = span(ids, attention_mask=mask)
    assert start.shape == end.shape == (2, 12) and torch.isinf(start[1, 8:]).all()
    h = enc(ids, attention_mask=mask)["hidden_states"]
    torch.testing.assert_close(start[0], h[0] @ span.start_end.weight[0] + span.start_end.bias[0])
    clf = SequenceClassifier(enc, 3).eval()
    torch.testing.assert_close(clf(ids, attention_mask=mask), clf.classifier(h[:, 0]))
