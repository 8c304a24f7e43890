"""XLNet in the trainer: permutation-LM pretraining on the embedded corpus (above a unigram baseline),
ZeRO-2 on two processes equal to one, Transformer-XL memory over streams resumed exactly (also at
another data-parallel size), glm eval, export to transformers, fine-tuning from the last position,
and the layouts it refuses."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch

from glm_dist.hf.export import export_checkpoint
from tests.conftest import ROOT, run_glm, train_losses

pytestmark = pytest.mark.slow
XLNET = str(ROOT / "configs/experiments/xlnet-tiny-cpu.yaml")
QUICK = [
    "train.eval_interval=0",
    "train.eval_batches=4",
    "train.micro_batch_size=8",
    "data.seq_len=64",
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.precision=fp32",
    "parallel.zero_stage=0",
    "data.vocab_size=2048",
    "model.vocab_size=2048",
    "train.warmup_steps=4",
]


@pytest.fixture(scope="module")
def xlnet_shards(corpus, tmp_path_factory):
    return str(tmp_path_factory.mktemp("xlnet-shards"))


def args(corpus: str, shards: str, out, *extra: str) -> list[str]:
    return [
        "train",
        "-c",
        XLNET,
        *QUICK,
        f"data.source={corpus}",
        f"data.shards_dir={shards}",
        f"train.out_dir={out}",
        *extra,
    ]


def summary(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


WHOLE_SPLIT = 64  # validation batches of 16: more than the split holds (23 at seq 64), so all of it


def unigram_baselines(shards: str) -> tuple[float, float]:
    """(accuracy of always guessing the most frequent training target, cross-entropy in nats of the
    training targets' unigram distribution) on every validation target (the whole split)."""
    from glm_dist.data.loader import Loader, validation_batches

    train, val = Counter(), Counter()
    loader = Loader(shards, objective="plm", seq_len=64, micro_batch_size=64)
    for _ in range(20):
        targets = loader.next_step()[0]["target_labels"]
        train.update(targets[targets != -100].tolist())
    for batch, _ in validation_batches(
        shards, seq_len=64, micro_batch_size=16, num_batches=WHOLE_SPLIT, objective="plm"
    ):
        targets = batch["target_labels"]
        val.update(targets[targets != -100].tolist())
    n_train, n_val = sum(train.values()), sum(val.values())
    guess = train.most_common(1)[0][0]
    entropy = -sum(n / n_val * math.log(max(train[tok], 1) / n_train) for tok, n in val.items())
    return val[guess] / n_val, entropy


@pytest.fixture(scope="module")
def pretrained(corpus, xlnet_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("xlnet")
    # 1000 steps at lr 1e-3: over seeds 11, 12 and 14 the whole split's accuracy was 0.576-0.580 against
    # the unigram guess's 0.515. 500 steps at lr 3e-3 (before) ranged 0.523-0.565 over seeds 1-3 (a
    # plateau some runs had not left yet), and CI's CPU once ended 0.009 above the guess.
    proc = run_glm(
        args(
            corpus,
            xlnet_shards,
            out,
            "train.max_steps=1000",
            "train.lr=1e-3",
            "train.micro_batch_size=16",
            f"train.eval_batches={WHOLE_SPLIT}",  # the loop validates on the whole split, as glm eval below
            "train.precision=fp32",
            "train.warmup_steps=20",
        )
    )
    # fp32 on every CPU: under bf16 (auto on an AVX512-BF16 CPU) the same 500 steps left a model
    # whose fine-tuned train accuracy was 0.549, below the bar of the export test (0.632)
    return out, summary(proc)


def evaluate(ckpt, shards: str, batches: int) -> dict:
    ev = run_glm(
        [
            "eval",
            "-c",
            XLNET,
            *QUICK,
            "train.micro_batch_size=16",
            f"train.eval_batches={batches}",
            f"data.shards_dir={shards}",
            "--checkpoint",
            str(ckpt),
        ]
    )
    return json.loads(ev.stdout[ev.stdout.index("{") :])


def test_tiny_xlnet_pretraining_beats_the_unigram_baseline_and_evaluates(pretrained, corpus, xlnet_shards):
    out, s = pretrained
    ckpt = out / "checkpoints/step_00001000"
    whole = evaluate(ckpt, xlnet_shards, WHOLE_SPLIT)  # ~3,900 targets: a standard error near 0.008
    assert whole["loss"] == pytest.approx(s["val_loss"], abs=2e-2)  # the loop's validation again, through glm eval
    accuracy, entropy = unigram_baselines(xlnet_shards)
    assert whole["tokens"] > 3000, whole
    assert whole["loss"] < entropy - 0.3, (whole, entropy)  # it uses the context, not just frequencies
    assert whole["accuracy"] > accuracy + 0.03, (whole, accuracy)  # measured +0.061 to +0.065 over 3 seeds


def test_xlnet_exports_to_transformers_and_fine_tunes_from_the_last_position(pretrained, docstring_task, tmp_path):
    from transformers import AutoTokenizer, XLNetLMHeadModel

    from glm_dist.eval.run import load_checkpoint_model

    out, _ = pretrained
    ckpt = out / "checkpoints/step_00001000"
    export_checkpoint(ckpt, tmp_path / "hf")  # what glm export-hf runs, without a process start
    model = XLNetLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    enc = tok(["Return the number of items.", "Open a file."], padding=True, return_tensors="pt")
    assert tok.padding_side == "left" and enc.input_ids[0, -1] == tok.cls_token_id
    ours, _ = load_checkpoint_model(ckpt)
    with torch.no_grad():
        theirs = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits
        mine = ours(enc.input_ids, attention_mask=enc.attention_mask)["logits"]
    real = enc.attention_mask.bool()
    assert (theirs[real] - mine[real]).abs().max().item() < 1e-4

    ft = run_glm(
        [
            "finetune",
            "--checkpoint",
            str(ckpt),
            "--train",
            docstring_task,
            "--epochs",
            "16",
            "--lr",
            "1e-3",
        ]
    )
    result = json.loads(ft.stdout[ft.stdout.index("{") :])
    # It learns the task. 16 epochs: with 8 (the learning rate decays over them) the training accuracy
    # ranged 0.58-0.80 over the pretraining splits seen (when the split hashed the corpus's tmp path, so
    # each run had another 500-step model), under the bar (0.632) in three runs; on one such model
    # 16 epochs reached 0.955 (held out 0.714) against a majority class of 0.482. The 56 held-out
    # examples are too few for a hard line at the majority.
    assert result["history"][-1]["train_accuracy"] > result["majority_baseline"] + 0.15, result
    assert result["valid_accuracy"] > result["majority_baseline"] - 0.1, result


def test_memory_streams_resume_exactly_and_zero2_on_two_ranks_matches_one(corpus, xlnet_shards, tmp_path):
    mem = ["train.max_steps=6", "train.global_batch_size=8", "data.seq_len=32", "model.mem_len=32"]
    one = tmp_path / "one"
    run_glm(args(corpus, xlnet_shards, one, *mem, "train.grad_accum_steps=2", "train.micro_batch_size=4"))
    split = tmp_path / "split"  # two ranks, stopped at step 3, resumed on one process
    run_glm(
        args(
            corpus,
            xlnet_shards,
            split,
            *mem,
            "train.micro_batch_size=4",
            "parallel.zero_stage=2",
            "train.stop_at_step=3",
        ),
        nproc=2,
    )
    assert sorted(p.name for p in (split / "checkpoints/step_00000003/stream_memory").iterdir()) == [
        "rank00000.safetensors",
        "rank00001.safetensors",
    ]
    # resumed at another layout and ZeRO stage: one process, ZeRO-3
    run_glm(
        args(
            corpus,
            xlnet_shards,
            split,
            *mem,
            "train.grad_accum_steps=2",
            "train.micro_batch_size=4",
            "parallel.zero_stage=3",
        )
    )
    reference, resumed = train_losses(one), train_losses(split)
    assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(reference, resumed)) < 1e-4, (reference, resumed)
    shorter = tmp_path / "shorter"  # the same streams with a shorter memory: the same first step only
    run_glm(
        args(
            corpus,
            xlnet_shards,
            shorter,
            *mem[:-1],
            "model.mem_len=4",
            "train.grad_accum_steps=2",
            "train.micro_batch_size=4",
        )
    )
    other = train_losses(shorter)
    # memory is used: the first step (empty memory) agrees, the later ones do not. In CI one step's
    # difference was 7.2e-5 (step 3, oneDNN capped at AVX2), so the largest over steps 2-6 is asserted.
    assert other[0] == pytest.approx(reference[0], abs=1e-6), (other, reference)
    assert max(abs(a - b) for a, b in zip(other[1:], reference[1:])) > 1e-4, (other, reference)


@pytest.mark.parametrize(
    "layout, message",
    [
        (["parallel.pipeline_stages=2"], "not xlnet (plm)"),
        (["parallel.tensor_parallel=2"], "families, not xlnet"),
    ],
)
def test_layouts_xlnet_does_not_split_are_refused_naming_it(layout, message, tmp_path):
    proc = run_glm(["config", "show", "-c", XLNET, "--world-size", "2", *layout], check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("recipe, gpus", [("xlnet-large", 512), ("xlnet-base", 64)])
def test_published_xlnet_recipes_validate_and_plan(recipe, gpus):
    cfg_path = str(ROOT / f"configs/experiments/published/{recipe}.yaml")
    proc = run_glm(["plan", "-c", cfg_path, "--gpus", str(gpus), "--json"])
    planned = json.loads(proc.stdout)
    assert planned["recommended"] is not None
    assert {(lay["pp"], lay["tp"]) for lay in planned["layouts"]} == {(1, 1)}  # XLNet neither pipelines nor splits
    proc = run_glm(["config", "show", "-c", cfg_path, "--world-size", str(gpus)])
    assert "family: xlnet" in proc.stdout and "max_steps: 500000" in proc.stdout


def test_paper_layout_segments_continue_their_stream_and_hide_the_rest_from_the_reused_part():
    import numpy as np

    from glm_dist.data.shards import Doc
    from glm_dist.objectives.permutation_lm import two_part_inputs
    from glm_dist.objectives.plm import PaperSegments

    def docs(start: int):  # counting tokens: continuity is visible; sentences every 7 tokens
        for i in range(10**6):
            first = start + 100 * i
            yield Doc(str(i), np.arange(first, first + 100), np.arange(0, 100, 7))

    for backward in (False, True):
        builder = PaperSegments(32, 12, sep_id=3, cls_id=4, backward=backward)
        segs = [seg for seg, _ in zip(builder.units(docs(1000), lambda k: np.random.default_rng(k)), range(30))]
        for (tokens, ids), (nxt, _) in zip(segs, segs[1:]):
            assert len(tokens) == 32 and tokens[-1] == 4 and list(ids[-2:]) == [1, 2]
            assert (ids[:12] == 0).all() and set(ids[12:-1].tolist()) <= {0, 1}
            step = -1 if backward else 1  # the next segment's reused part follows this one's in the stream
            jumps = np.diff(np.concatenate([tokens[:12], nxt[:12]]))
            assert (jumps == step).mean() > 0.8  # breaks only where a document ends
    tokens, ids = segs[0]
    out = two_part_inputs(tokens, ids, 12, np.random.default_rng(0), special_ids=np.array([3, 4]))
    perm = out["perm_mask"]
    assert perm[:12, 12:].all() and not perm[12:, :12].any()  # memory states never see this segment's rest
    assert out["target_mapping"].sum() == len(out["target_labels"]) == (out["labels"] != -100).sum()


def test_paper_layout_with_bi_data_resumes_exactly(corpus, xlnet_shards, tmp_path):
    paper = [
        "train.max_steps=5",
        "data.seq_len=32",
        "model.mem_len=16",
        "model.reuse_len=16",
        "objective.plm_layout=paper",
        "model.bi_data=true",
        "train.micro_batch_size=4",
    ]
    run_glm(args(corpus, xlnet_shards, tmp_path / "one", *paper))
    run_glm(args(corpus, xlnet_shards, tmp_path / "two", *paper, "train.stop_at_step=2"))
    run_glm(args(corpus, xlnet_shards, tmp_path / "two", *paper))
    assert train_losses(tmp_path / "one") == train_losses(tmp_path / "two")
    proc = run_glm(args(corpus, xlnet_shards, tmp_path / "bad", *paper[:-1], "train.micro_batch_size=3"), check=False)
    assert proc.returncode == 2 and "model.bi_data" in proc.stderr
