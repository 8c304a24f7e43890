"""AWD-LSTM (ULMFiT's LM): the published count on the meta device, the authors' regularisation
(dropouts, weight drop, AR / TAR), padding invariance of the outputs and of the awd_lm loss,
causality, BPT3C windows equal to one pass, pretraining on the embedded corpus, ZeRO-2 on two
processes equal to one with exact resume, the layouts it refuses and the published plan."""

from __future__ import annotations

import json

import pytest
import torch

from glm_dist.families.awd_lstm.model import AwdLstm, awd_lstm_config
from glm_dist.families.registry import published_flavors
from glm_dist.objectives.awd_lm import AWD_LM, activation_penalties
from glm_dist.transfer.inputs import pad_ids
from glm_dist.transfer.ulmfit import ConcatPoolClassifier
from tests.conftest import ROOT, train_losses
from tests.test_glove import glm as run_glm  # one thread per process

AWD = str(ROOT / "configs/experiments/awd-lstm-tiny-cpu.yaml")
QUICK = [
    "train.eval_interval=0",
    "train.eval_batches=4",
    "train.micro_batch_size=8",
    "data.seq_len=32",
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "model.vocab_size=3000",
    "train.save_interval=0",
]


def tiny(flavor: str = "awd-lstm-tiny", **kw) -> AwdLstm:
    torch.manual_seed(0)
    return AwdLstm(awd_lstm_config(flavor, vocab_size=60, d_model=16, d_hidden=32, **kw)).eval()


def test_published_awd_lstm_counts_the_papers_24m_on_the_meta_device():
    flavor = published_flavors("awd-lstm")["awd-lstm"]
    with torch.device("meta"):
        model = AwdLstm(flavor.cfg)
    lstms = [sum(p.numel() for p in rnn.parameters()) for rnn in model.rnns]
    n = sum(p.numel() for p in model.parameters())  # the tied output matrix counted once
    print(f"AWD-LSTM (PTB, 10k words): LSTMs {lstms}, embedding {model.embed.weight.numel():,}, total {n:,}")
    assert lstms == [7_139_200, 10_589_200, 2_483_200] and n == 24_221_600
    assert abs(n - flavor.params) / flavor.params <= flavor.tol
    cfg = flavor.cfg  # the authors' main.py defaults, the source the config names
    assert (
        cfg.embed_dropout,
        cfg.input_dropout,
        cfg.hidden_dropout,
        cfg.output_dropout,
        cfg.weight_drop,
        cfg.ar_alpha,
        cfg.tar_beta,
        cfg.context_length,
    ) == (0.1, 0.65, 0.3, 0.4, 0.5, 2.0, 1.0, 70)


def test_regularisation_is_on_in_training_only():
    model = tiny().train()
    assert model.embed.p == 0.1 and model.rnns[0].rnn.p == 0.5  # word dropout, DropConnect on weight_hh
    x = torch.randint(4, 60, (2, 9))
    a, b = model(x)["logits"], model(x)["logits"]
    assert not torch.allclose(a, b)  # new masks each pass
    model.eval()
    assert torch.equal(model(x)["logits"], model(x)["logits"])
    out = tiny()(x)
    assert torch.equal(out["output"], out["raw_output"])  # no output dropout in evaluation
    assert out["logits"].shape == (2, 9, 60) and [s[0].shape for s in out["state"]] == [
        (1, 2, 32),
        (1, 2, 32),
        (1, 2, 16),
    ]
    tied = out["output"] @ model.embed.weight.T + model.out_bias  # the output layer is the embedding matrix
    assert torch.allclose(out["logits"], tied, atol=1e-6)


def test_ar_and_tar_are_the_papers_penalties_over_real_positions():
    out = torch.tensor([[[1.0, 3.0], [2.0, 2.0], [9.0, 9.0]]])  # (1, 3, 2); the last position is padding
    raw = torch.tensor([[[0.0, 0.0], [1.0, 3.0], [5.0, 5.0]]])
    real = torch.tensor([[True, True, False]])
    ar = ((1 + 9) / 2 + (4 + 4) / 2) / 2  # mean of output^2 over the two real positions
    tar = (1 + 9) / 2  # one real step: mean of (raw_1 - raw_0)^2
    got = activation_penalties(out, raw, real, alpha=2.0, beta=1.0)
    assert got.item() == pytest.approx(2 * ar + 1 * tar)


def test_padding_never_changes_outputs_or_the_loss():
    model = tiny()
    seqs = [torch.randint(4, 60, (n,)) for n in (7, 3, 5)]
    ids, mask = pad_ids([s.tolist() for s in seqs], 0)
    labels = torch.where(mask.bool(), torch.randint(4, 60, (3, 7)), -100)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for b, s in enumerate(seqs):
            alone = model(s[None])
            for key in ("logits", "output", "raw_output"):
                assert torch.allclose(batch[key][b, : len(s)], alone[key][0], atol=1e-5), (key, b)
        loss, _ = AWD_LM.loss(model, {"input_ids": ids, "labels": labels, "attention_mask": mask}, metrics=False)
        other = ids.masked_fill(mask == 0, 17)  # other tokens in the padding
        again, sums = AWD_LM.loss(model, {"input_ids": other, "labels": labels, "attention_mask": mask}, metrics=True)
    assert loss.item() == pytest.approx(again.item(), abs=1e-6) and sums["targets"] == 15
    nll = torch.nn.functional.cross_entropy(batch["logits"].flatten(0, 1), labels.flatten(), reduction="sum")
    assert sums["nll"] == pytest.approx(nll.item(), rel=1e-5)


def test_the_lm_reads_only_the_past():
    model = tiny()
    ids = torch.randint(4, 60, (1, 9))
    changed = ids.clone()
    changed[0, 4] = 4 + (ids[0, 4] - 3) % 56
    with torch.no_grad():
        diff = (model(ids)["logits"] - model(changed)["logits"]).abs().amax(-1)[0]
    assert (diff[:4] == 0).all() and (diff[4:] > 0).all()


def test_bpt3c_windows_with_the_carried_state_equal_one_pass_and_padding_changes_nothing():
    lm = tiny()
    docs = [torch.randint(4, 60, (n,)).tolist() for n in (11, 3, 8)]
    ids, mask = pad_ids(docs, 0)
    lengths = mask.sum(1)
    windows, whole = ConcatPoolClassifier(lm, 5, bptt=3).eval(), ConcatPoolClassifier(lm, 5, bptt=100).eval()
    whole.head.load_state_dict(windows.head.state_dict())
    with torch.no_grad():
        a, b = windows(ids, lengths), whole(ids, lengths)
        assert torch.allclose(a["output"], b["output"], atol=1e-5) and torch.allclose(
            a["logits"], b["logits"], atol=1e-5
        )
        for i, d in enumerate(docs):
            alone = windows(torch.tensor([d]), torch.tensor([len(d)]))["logits"][0]
            assert torch.allclose(alone, a["logits"][i], atol=1e-5)
    assert windows.head[0].num_features == 3 * 16 and windows.head[2].out_features == 50  # [h_T; max; mean] -> 50


# -- training ------------------------------------------------------------------------------------------
def args(shards_dir: str, out, *extra: str) -> list[str]:
    return ["train", "-c", AWD, *QUICK, f"data.shards_dir={shards_dir}", f"train.out_dir={out}", *extra]


@pytest.mark.slow
def test_zero2_on_two_ranks_matches_one_process_and_resumes_exactly_on_another_layout(shards, tmp_path):
    root = shards("word")
    run = [
        "model.flavor=awd-lstm-tiny-plain",
        "train.max_steps=6",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "train.lr=3e-3",
        "train.warmup_steps=0",
        "train.schedule=constant",
    ]
    one = tmp_path / "one"
    run_glm(args(root, one, *run, "train.grad_accum_steps=2", "parallel.zero_stage=0"))
    split = tmp_path / "split"  # two ranks with ZeRO-2 stopped after step 3, resumed on one process
    run_glm(args(root, split, *run, "parallel.zero_stage=2", "train.stop_at_step=3"), nproc=2)
    run_glm(args(root, split, *run, "parallel.zero_stage=2", "train.grad_accum_steps=2"))
    reference, resumed = train_losses(one), train_losses(split)
    print(
        "one process:",
        [round(x, 5) for x in reference],
        "\ntwo ranks, ZeRO-2, resumed at 3 on one:",
        [round(x, 5) for x in resumed],
    )
    assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(reference, resumed)) < 1e-4, (reference, resumed)
    assert reference[-1] < reference[0] - 0.04  # it trains: measured 8.017 -> 7.939 in six steps


@pytest.mark.parametrize("layout", ["parallel.pipeline_stages=2", "parallel.tensor_parallel=2"])
def test_layouts_awd_lstm_does_not_split_are_refused(layout):
    proc = run_glm(["config", "show", "-c", AWD, "--world-size", "2", layout], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "not awd-lstm" in proc.stderr, proc.stderr


def test_published_awd_lstm_recipe_validates_and_plans():
    recipe = str(ROOT / "configs/experiments/published/awd-lstm.yaml")
    planned = json.loads(run_glm(["plan", "-c", recipe, "--gpus", "8", "--json"]).stdout)
    assert planned["recommended"] is not None
    assert {(lay["pp"], lay["tp"]) for lay in planned["layouts"]} == {(1, 1)}
    shown = run_glm(["config", "show", "-c", recipe, "--world-size", "8"]).stdout
    assert "family: awd-lstm" in shown and "seq_len: 70" in shown and "schedule: stlr" in shown
