"""ULMFiT's tricks and Houlsby adapters (glm_dist/transfer/tricks.py) on AWD-LSTM and on transformer
families: the slanted triangular curve against the paper's formula, the discriminative rate of every
layer group, which parameters train in each epoch of gradual unfreezing, adapters that start near the
identity and are (with the norms and the head) all that learns; the recipes that carry the options;
and the three ULMFiT stages on one checkpoint lineage (glm train, glm train with train.init_from,
glm finetune --recipe ulmfit) and a GPT fine-tuned with every trick through glm finetune."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from glm_dist.config.loader import load_config
from glm_dist.families.awd_lstm.model import AwdLstm, awd_lstm_config
from glm_dist.families.bert.model import Encoder, encoder_config
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.models.heads import SequenceClassifier
from glm_dist.families.registry import family
from glm_dist.parallel.engine import set_lr
from glm_dist.transfer.options import FinetuneArgs
from glm_dist.train.optim import build_optimizer
from glm_dist.train.schedule import lr_at
from glm_dist.transfer.heads import GPTTransfer
from glm_dist.transfer.inputs import SpecialTokens, classification, pack, pad_ids
from glm_dist.transfer.tricks import Tricks, TrickError, layer_groups, slanted_triangular
from glm_dist.transfer.ulmfit import ConcatPoolClassifier
from tests.conftest import ROOT, run_glm


def _awd() -> tuple[ConcatPoolClassifier, AwdLstm]:
    torch.manual_seed(0)
    lm = AwdLstm(awd_lstm_config("awd-lstm-tiny", vocab_size=60, d_model=16, d_hidden=32))
    return ConcatPoolClassifier(lm, 4), lm


def _gpt() -> tuple[GPTTransfer, GPT]:
    torch.manual_seed(0)
    lm = GPT(gpt_config("tiny", n_layer=3, d_model=32, n_head=4, vocab_size=103, context_length=32))
    return GPTTransfer(lm, "classify", 4), lm


def _tricks(**kw) -> Tricks:
    return Tricks.from_args(FinetuneArgs(checkpoint="c", train="t", **kw))


def _rates(groups: list[dict], lr: float) -> dict[int, float]:
    """parameter id -> the rate set_lr gives it."""
    opt = build_optimizer(torch.nn.Linear(1, 1), load_config(None, []).train, groups)
    set_lr(SimpleNamespace(optimizer=opt), lr)
    return {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}


# -- slanted triangular learning rates ---------------------------------------------------------------
def test_slanted_triangular_rates_follow_the_papers_formula():
    T, peak = 1000, 0.01
    cut = math.floor(T * 0.1)
    for t in (0, 1, 50, 99, 100, 101, 500, 999):
        p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / 0.1 - 1))
        assert slanted_triangular(t, T, peak=peak) == pytest.approx(peak * (1 + p * 31) / 32), t
    curve = [slanted_triangular(t, T, peak=peak) for t in range(T)]
    assert curve.index(max(curve)) == cut and max(curve) == pytest.approx(peak)
    assert curve[0] == pytest.approx(peak / 32) and curve[-1] == pytest.approx(peak / 32 * (1 + 31 / 900))
    assert all(a < b for a, b in zip(curve[:cut], curve[1 : cut + 1])) and all(
        a > b for a, b in zip(curve[cut:], curve[cut + 1 :])
    )
    train = load_config(None, ["train.schedule=stlr", "train.lr=0.01", "train.max_steps=1000"]).train
    assert [lr_at(t, train) for t in range(T)] == curve  # glm train's stage-2 schedule is the same function
    assert _tricks(schedule="stlr").lr(100, T, peak) == pytest.approx(peak)


# -- discriminative fine-tuning ----------------------------------------------------------------------
def test_discriminative_rates_divide_by_2_6_per_layer_group_on_awd_lstm():
    model, lm = _awd()
    groups = _tricks(discriminative_lr=2.6).prepare(model, lm, model.head, weight_decay=0.01)
    rates = _rates(groups, 0.01)
    expected = {
        "embedding": 0.01 / 2.6**4,
        "lstm 1": 0.01 / 2.6**3,
        "lstm 2": 0.01 / 2.6**2,
        "lstm 3": 0.01 / 2.6,
        "head": 0.01,
    }
    parts = {
        "embedding": [lm.embed.weight],
        "lstm 1": list(lm.rnns[0].parameters()),
        "lstm 2": list(lm.rnns[1].parameters()),
        "lstm 3": [*lm.rnns[2].parameters(), lm.out_bias],
        "head": list(model.head.parameters()),
    }
    for name, params in parts.items():
        assert all(rates[id(p)] == pytest.approx(expected[name]) for p in params), name
    assert len(rates) == sum(1 for _ in model.parameters())  # every parameter has exactly one rate
    plain = _rates(_tricks().prepare(*_awd()[:1], _awd()[1], None, weight_decay=0.01), 0.01)
    assert set(plain.values()) == {0.01}


def test_discriminative_rates_on_a_transformer_put_the_final_norm_with_the_top_block():
    model, lm = _gpt()
    groups = _tricks(discriminative_lr=2.6).prepare(model, lm, model.classifier, weight_decay=0.01)
    rates = _rates(groups, 1e-3)
    # groups: embedding (tied with the output layer), blocks 0 and 1, block 2 + final norm, the classifier
    assert rates[id(lm.embed.wte.weight)] == pytest.approx(1e-3 / 2.6**4) == rates[id(lm.embed.wpe.weight)]
    for i, block in enumerate(lm.blocks):
        assert all(rates[id(p)] == pytest.approx(1e-3 / 2.6 ** (3 - i)) for p in block.parameters()), i
    assert rates[id(lm.head.ln_f.weight)] == pytest.approx(1e-3 / 2.6)
    assert rates[id(model.classifier.weight)] == pytest.approx(1e-3)
    encoder = Encoder(encoder_config("bert-tiny", n_layer=2, d_model=32, n_head=4, d_ff=64, vocab_size=50))
    assert len(layer_groups(encoder)) == 3  # embedding, block 0, block 1 + its pretraining head


# -- gradual unfreezing --------------------------------------------------------------------------------
def _with_grad(model, loss) -> set[int]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {id(p) for p in model.parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["awd-lstm", "gpt"])
def test_gradual_unfreezing_trains_one_more_group_from_the_top_each_epoch(kind):
    model, lm = _awd() if kind == "awd-lstm" else _gpt()
    head = model.head if kind == "awd-lstm" else model.classifier
    tricks = _tricks(gradual_unfreezing=True)
    tricks.prepare(model, lm, head, weight_decay=0.01)
    groups = tricks.groups
    assert len(groups) == 5  # awd-lstm: embedding, 3 LSTM layers, head; gpt: embedding, 3 blocks, classifier
    if kind == "awd-lstm":
        ids, mask = pad_ids([[5, 6, 7, 8], [9, 10]], 0)
        forward = lambda: model.loss(model(ids, mask.sum(1)), torch.tensor([1, 2]))  # noqa: E731
    else:
        batch = pack(
            [classification([5, 6, 7], SpecialTokens.after(100), 16), classification([8], SpecialTokens.after(100), 16)]
        )
        forward = lambda: model.loss(model(**batch), torch.tensor([1, 2]), 0.5)  # noqa: E731
    for epoch in range(6):
        tricks.start_epoch(epoch)
        top = min(epoch + 1, len(groups))
        expect = {id(p) for g in groups[len(groups) - top :] for p in g}
        assert {id(p) for p in model.parameters() if p.requires_grad} == expect, epoch
        unused = {id(lm.out_bias)} if kind == "awd-lstm" else set()  # the LM's output bias: no classifier reads it
        assert _with_grad(model, forward()) == expect - unused, epoch  # the frozen groups get no gradient


# -- adapters ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_adapters_start_near_the_identity_and_only_they_the_norms_and_the_head_learn(kind):
    torch.manual_seed(0)
    if kind == "gpt":
        model, lm = _gpt()
        head, sites = model.classifier, family("gpt").adapter_sites
        batch = pack([classification([5, 6, 7, 8], SpecialTokens.after(100), 16)] * 2)
        run = lambda: model(**batch)["logits"]  # noqa: E731
    else:
        lm = Encoder(encoder_config("bert-tiny", n_layer=2, d_model=32, n_head=4, d_ff=64, vocab_size=50))
        model, head, sites = SequenceClassifier(lm, 3), None, family("bert").adapter_sites
        head = model.classifier
        ids = torch.randint(5, 50, (2, 7))
        run = lambda: model(ids)  # noqa: E731
    model.eval()
    with torch.no_grad():
        before = run()
    tricks = _tricks(adapters=8)
    tricks.prepare(model, lm, head, adapter_sites=sites, weight_decay=0.01)
    adapters = [m for m in model.modules() if type(m).__name__ == "Adapter"]
    assert len(adapters) == 2 * len(lm.blocks)  # after every attention and every FFN sublayer
    with torch.no_grad():
        near = run()
        for a in adapters:
            a.up.weight.zero_()
        exact = run()
    assert torch.equal(exact, before)  # W_up = 0: the identity
    assert (near - before).abs().max() < 1e-3 * before.abs().max()  # the paper's N(0, 1e-2) init: near it
    learned = _with_grad(model, run().float().logsumexp(-1).sum())
    used = lm if kind == "gpt" else torch.nn.ModuleList([lm.embed, *lm.blocks])  # (not BERT's MLM head's norm)
    norms = {id(p) for m in used.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    expect = {id(p) for a in adapters for p in a.parameters()} | norms | {id(p) for p in head.parameters()}
    assert learned == expect
    named = dict(lm.named_parameters())
    assert all(
        not named[n].requires_grad for n in named if n.endswith("attn.proj.weight") or n.endswith("attn.dense.weight")
    )


def test_adapters_are_refused_where_there_are_no_transformer_blocks():
    model, lm = _awd()
    with pytest.raises(TrickError, match="adapters sit in transformer blocks"):
        _tricks(adapters=8).prepare(
            model, lm, model.head, adapter_sites=family("awd-lstm").adapter_sites, weight_decay=0.01
        )
    with pytest.raises(TrickError, match="--discriminative-lr 0.5"):
        _tricks(discriminative_lr=0.5)


def test_the_ulmfit_recipe_carries_the_papers_options():
    from glm_dist.transfer.recipes import finetune_args, load_recipe

    args = finetune_args({"checkpoint": "c", "train": "t", "recipe": "ulmfit", "gradual_unfreezing": None})
    assert (args.lr, args.batch_size, args.schedule, args.discriminative_lr, args.gradual_unfreezing, args.bptt) == (
        0.01,
        64,
        "stlr",
        2.6,
        True,
        70,
    )
    assert load_recipe(str(ROOT / "configs/experiments/ulmfit-classifier-tiny-cpu.yaml"))["gradual_unfreezing"] is True


# -- the three stages and glm finetune's options end to end ---------------------------------------------
def _result(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def _docstring_rows(tmp_path) -> tuple[str, str]:
    from data_pipeline.embedded import docstring_task  # what glm data docstring-task writes

    rows = list(docstring_task())
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = tmp_path / "text.jsonl"  # the task's own text, unlabelled: stage 2's documents
    text.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in rows))
    return str(task), str(text)


@pytest.mark.slow
def test_ulmfit_stages_share_one_lineage_general_lm_target_lm_classifier(shards, tmp_path):
    quick = [
        "logging.wandb=false",
        "logging.progress=false",
        "train.plot=false",
        "train.eval_interval=0",
        "train.save_interval=0",
        "train.eval_batches=4",
        "model.vocab_size=3000",
        "data.seq_len=32",
        "train.micro_batch_size=8",
    ]
    general = tmp_path / "general"
    s1 = _result(
        run_glm(
            [
                "train",
                "-c",
                str(ROOT / "configs/experiments/awd-lstm-tiny-cpu.yaml"),
                *quick,
                f"data.shards_dir={shards('word')}",
                f"train.out_dir={general}",
                "train.max_steps=40",
                "train.warmup_steps=4",
            ]
        )
    )
    stage1 = general / "checkpoints/step_00000040"
    task, text = _docstring_rows(tmp_path)
    target = tmp_path / "target"
    proc = run_glm(
        [
            "train",
            "-c",
            str(ROOT / "configs/experiments/ulmfit-target-lm-tiny-cpu.yaml"),
            *quick,
            f"data.source={text}",
            f"data.tokenizer={stage1}/tokenizer.json",
            f"data.shards_dir={tmp_path}/ts",
            "data.val_per_mille=100",
            f"train.out_dir={target}",
            f"train.init_from={stage1}",
            "train.max_steps=10",
        ]
    )
    s = _result(proc)
    print(
        f"stage 2 from stage 1's weights: validation loss {s['val_loss_before']:.3f} -> {s['val_loss']:.3f}; "
        f"stage 1 untrained {s1['val_loss_before']:.3f}"
    )
    # stage 2 starts from stage 1's LM (measured 7.31 against 8.0 untrained) and a new schedule from step 0
    assert s["val_loss_before"] < s1["val_loss_before"] - 0.4 and s["step"] == 10
    meta = json.loads((target / "checkpoints/step_00000010/meta.json").read_text())
    assert meta["config"]["train"]["init_from"] == str(stage1)  # the lineage is recorded
    out = tmp_path / "classifier"
    result = _result(
        run_glm(
            [
                "finetune",
                "--recipe",
                str(ROOT / "configs/experiments/ulmfit-classifier-tiny-cpu.yaml"),
                "--checkpoint",
                str(target / "checkpoints/step_00000010"),
                "--train",
                task,
                "--batch-size",
                "16",
                "--out",
                str(out),
            ]
        )
    )
    print("ULMFiT classifier on the docstring task:", result["history"], "majority", result["majority_baseline"])
    assert result["settings"] | {"batch_size": 16} == {
        "lr": 0.01,
        "batch_size": 16,
        "epochs": 5,
        "bptt": 70,
        "max_len": 1400,
        "schedule": "stlr",
        "discriminative_lr": 2.6,
        "gradual_unfreezing": True,
        "adapters": 0,
        "layer_groups": 5,
        "drop_mult": 0.2,
    }
    # it trains (the loss measured 2.02 -> 1.38 and 2.10 -> 1.56), but five epochs of gradual unfreezing over a
    # 40-step LM stay near the majority class (0.48-0.50 measured); bench/ulmfit_ablation.py measures learning
    history = result["history"]
    # near it, not on it: the 56 held-out examples move 0.018 each (0.429 in one CI run, when the split
    # still hashed the corpus's tmp path and so changed the 40-step LM from run to run)
    assert (
        history[-1]["loss"] < history[0]["loss"] - 0.3 and result["valid_accuracy"] >= result["majority_baseline"] - 0.1
    )
    assert (out / "model.safetensors").exists()


@pytest.mark.slow
def test_a_gpt_fine_tuned_with_adapters_keeps_its_pretrained_weights(shards_dir, tmp_path):
    from glm_dist.eval.run import load_checkpoint_model
    from tests.conftest import FAST

    run_glm(
        [
            "train",
            "-c",
            str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml"),
            *FAST,
            f"data.shards_dir={shards_dir}",
            "data.vocab_size=2048",
            "model.vocab_size=2048",
            "train.max_steps=10",
            f"train.out_dir={tmp_path / 'pre'}",
        ]
    )
    ckpt = str(tmp_path / "pre/checkpoints/step_00000010")
    task, _ = _docstring_rows(tmp_path)
    result = _result(
        run_glm(
            [
                "finetune",
                "--checkpoint",
                ckpt,
                "--train",
                task,
                "--epochs",
                "2",
                "--lr",
                "3e-3",
                "--adapters",
                "8",
                "--schedule",
                "stlr",
                "--discriminative-lr",
                "2.6",
                "--gradual-unfreezing",
                "--out",
                str(tmp_path / "ft"),
            ]
        )
    )
    assert (
        result["settings"]["adapters"] == 8 and result["settings"]["layer_groups"] == 4
    )  # embed, block, block + head, W_y
    from safetensors.torch import load_file

    tuned = load_file(tmp_path / "ft/model.safetensors")
    pretrained, _ = load_checkpoint_model(ckpt)
    for name, weight in pretrained.state_dict().items():
        if name.startswith("embed.wte") or name.startswith("head.lm_head"):
            continue  # grown by GPT's three new tokens
        # two epochs of gradual unfreezing reach the top two groups: W_y, then block 1 with the final norm;
        # in them only the adapters and the layer norms learn
        learns = name.startswith(("blocks.1.ln_", "head.ln_f"))
        assert torch.equal(tuned[f"lm.{name}"], weight) != learns, name
    assert any(k.endswith("attn.proj.adapter.up.weight") for k in tuned)
