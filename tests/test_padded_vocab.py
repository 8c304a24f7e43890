"""A padded vocabulary (model.pad_vocab_to_multiple_of): the model stores more embedding rows, and
computes as the unpadded one -- the same logits, loss and gradients in fp32, never a padding id
generated, published parameter counts, exports of the real size that transformers reproduces, and
unpadded state dicts (checkpoints from before, transformers models) load. Under the vocabulary split
of tensor parallelism the padding falls on the last rank's rows and is left out there too; a pipeline's
last stage holds the padded tied matrix and scores as the head does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from glm_dist.models.generate import GenerationConfig, generate
from glm_dist.families.gpt.hf import export_hf, import_hf
from glm_dist.models.common import count_parameters
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.families.registry import build_model, model_config_from_dict, published_flavors
from glm_dist.objectives.registry import get_objective
from glm_dist.ops.cross_entropy import cross_entropy, predicted, vocab_padding
from tests.conftest import ROOT, clean_env

VOCAB = 300  # padded to 384 rows at a multiple of 128


def _pair(seed: int = 0) -> tuple[GPT, GPT]:
    """An unpadded GPT and the same weights padded to a multiple of 128, whose padding rows are 10x
    the real ones: their logits win every position, so were they in a softmax, or sampled, every
    result below would change."""
    torch.manual_seed(seed)
    cfg = gpt_config("tiny", n_layer=2, d_model=64, n_head=4, vocab_size=VOCAB, context_length=64)
    whole = GPT(cfg)
    with torch.no_grad():
        for p in whole.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)  # outputs that vary (the init's are nearly uniform)
    padded = GPT(replace(cfg, pad_vocab_to_multiple_of=128))
    padded.load_state_dict(whole.state_dict())  # the real rows, then zero padding rows
    assert padded.embed.wte.weight.shape == (384, 64) and padded.head.lm_head.weight is padded.embed.wte.weight
    assert torch.equal(padded.embed.wte.weight[VOCAB:], torch.zeros(84, 64))
    with torch.no_grad():
        padded.embed.wte.weight[VOCAB:].normal_(0, 3.0)
    return whole.eval(), padded.eval()


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (3, 41), generator=torch.Generator().manual_seed(seed))
    labels = ids[:, 1:].clone()
    labels[0, :5] = -100
    return {"input_ids": ids[:, :-1], "labels": labels}


def test_padded_model_gives_the_unpadded_logits_loss_and_gradients_in_fp32():
    whole, padded = _pair()
    batch = _batch()
    with torch.no_grad():
        logits = padded(batch["input_ids"])
        assert logits.shape == (3, 40, VOCAB)
        torch.testing.assert_close(logits, whole(batch["input_ids"]), rtol=0, atol=1e-6)
    clm = get_objective("clm")
    ref, _ = clm.loss(whole, batch, metrics=False)
    loss, _ = clm.loss(padded, batch, metrics=False)  # the fused loss, on the padded output matrix
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    ref_grads = dict(zip([n for n, _ in whole.named_parameters()], torch.autograd.grad(ref, list(whole.parameters()))))
    for (name, _), g in zip(padded.named_parameters(), torch.autograd.grad(loss, list(padded.parameters()))):
        if name == "embed.wte.weight":
            assert torch.equal(g[VOCAB:], torch.zeros_like(g[VOCAB:]))  # the padding never learns
            g = g[:VOCAB]
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-6)


def test_losses_of_given_logits_and_argmax_leave_the_padding_out():
    """A loss over logits a model made whole (a pipeline's last stage scores them so) and ``predicted``."""
    _, padded = _pair()
    batch = _batch()
    with torch.no_grad():
        logits = padded(batch["input_ids"], project=lambda h, w, b: F.linear(h, w))  # (3, 40, 384): all of them
    assert logits.shape[-1] == 384 and (logits[..., VOCAB:].amax(-1) > logits[..., :VOCAB].amax(-1)).all()
    real = logits[..., :VOCAB]
    with vocab_padding(84):
        loss = cross_entropy(logits.requires_grad_(), batch["labels"], reduction="mean", chunk_tokens=32)
        assert torch.equal(predicted(logits), real.argmax(-1))
    torch.testing.assert_close(
        loss, F.cross_entropy(real.flatten(0, 1), batch["labels"].flatten()), rtol=1e-6, atol=1e-6
    )
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.equal(grad[..., VOCAB:], torch.zeros_like(grad[..., VOCAB:]))


@pytest.mark.parametrize("strategy,beams", [("greedy", 1), ("sample", 1), ("beam", 3)])
def test_generation_never_returns_a_padding_id(strategy, beams):
    whole, padded = _pair()
    prompt = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(3))
    cfg = GenerationConfig(max_new_tokens=24, strategy=strategy, num_beams=beams, seed=7)
    out = generate(padded, prompt, cfg)
    assert out.shape[1] > 4 and int(out.max()) < VOCAB
    assert torch.equal(out, generate(whole, prompt, cfg))


def test_export_has_the_real_vocabulary_and_transformers_gives_our_logits(tmp_path):
    from transformers import GPT2LMHeadModel

    _, padded = _pair()
    export_hf(padded.cfg, padded.state_dict(), str(tmp_path), tokenizer_file=None)
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.config.vocab_size == VOCAB and hf.transformer.wte.weight.shape == (VOCAB, 64)
    x = _batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, padded(x), rtol=0, atol=1e-4)
    cfg, sd = import_hf(hf, pad_vocab_to_multiple_of=128)  # and back, padded again
    again = GPT(cfg).eval()
    again.load_state_dict(sd)
    assert again.embed.wte.weight.shape == (384, 64)
    with torch.no_grad():
        torch.testing.assert_close(again(x), hf(x).logits, rtol=0, atol=1e-4)


def test_an_unpadded_checkpoint_loads_into_a_padded_model():
    """A state dict written before the padding (strictly: every key, the tied head's too) and an old
    meta.json's model config, which has no pad_vocab_to_multiple_of and rebuilds the unpadded model."""
    whole, _ = _pair()
    saved = {k: v.clone() for k, v in whole.state_dict().items()}
    assert saved["embed.wte.weight"].shape == (VOCAB, 64)
    padded = GPT(replace(whole.cfg, pad_vocab_to_multiple_of=128)).eval()
    padded.load_state_dict(saved, strict=True)
    x = _batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(padded(x), whole(x), rtol=0, atol=1e-6)
    old_meta = {k: v for k, v in dataclasses.asdict(whole.cfg).items() if k != "pad_vocab_to_multiple_of"}
    assert model_config_from_dict("gpt", old_meta) == whole.cfg
    assert model_config_from_dict("gpt", dataclasses.asdict(padded.cfg)).padded_vocab_size == 384


@pytest.mark.parametrize("name", ["gpt2-small", "gpt2-xl", "gpt3-small"])
def test_parameter_counts_and_flops_count_the_real_vocabulary(name):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = published_flavors("gpt")[name].cfg
    with torch.device("meta"):
        padded, whole = build_model("gpt", replace(cfg, pad_vocab_to_multiple_of=128)), build_model("gpt", cfg)
        hf = GPT2LMHeadModel(
            GPT2Config(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.d_model, n_positions=cfg.context_length)
        )
    assert padded.embed.wte.weight.shape[0] == 50304
    assert count_parameters(padded) == count_parameters(whole) == hf.num_parameters()
    assert padded.num_flops_per_token(1024) == whole.num_flops_per_token(1024)


def test_the_pipelines_last_stage_scores_the_real_vocabulary_from_the_padded_tied_matrix():
    """The last stage's tied copy has the embedding's padded shape (one tied matrix, one checkpoint
    tensor) and its logits are the head's: the real vocabulary, the padding never predicted."""
    from glm_dist.families.gpt.pipeline import TiedOutput, _logits

    _, padded = _pair()
    out = TiedOutput(padded.cfg)
    out.load_state_dict({"wte.weight": padded.embed.wte.weight})  # the 10x padding rows too
    x = _batch()["input_ids"]
    with torch.no_grad():
        hidden = padded(x, project=lambda h, w, b: h)  # (3, 40, C) after the final norm
        logits = _logits(out, hidden, padding=84)
        torch.testing.assert_close(logits, padded(x), rtol=0, atol=0)
    assert logits.shape == (3, 40, VOCAB) and int(predicted(logits).max()) < VOCAB


@pytest.mark.slow
def test_a_padded_gpt_pipelined_over_two_stages_trains_as_one_process(shards_dir, tmp_path):
    """Vocabulary 2100 padded to 2176 (the shards' ids stay below 2048): PP=2 gives the one-process
    losses step by step -- were the padding in the last stage's softmax, they would rise by about
    log(2176 / 2100) = 0.036 -- and its checkpoint consolidates to the one-process tensors."""
    from tests.test_parallel import PIPE_TOL, assert_same_weights, pipe_run

    padded = ["model.vocab_size=2100", "model.pad_vocab_to_multiple_of=128", "train.max_steps=3"]
    one = pipe_run(shards_dir, tmp_path / "one", *padded, "train.grad_accum_steps=4")
    pp2 = pipe_run(
        shards_dir, tmp_path / "pp2", *padded, "train.grad_accum_steps=4", "parallel.pipeline_stages=2", nproc=2
    )
    assert len(pp2) == len(one) == 3 and max(abs(a - b) for a, b in zip(pp2, one)) <= PIPE_TOL, (one, pp2)
    assert_same_weights(tmp_path / "pp2/checkpoints/step_00000003", tmp_path / "one/checkpoints/step_00000003")


TP_SCRIPT = r"""
import json, sys
from dataclasses import replace
import torch, torch.distributed as dist
from glm_dist.families.gpt.model import GPT, gpt_config
from glm_dist.families.gpt.pipeline import TiedOutput, _logits
from glm_dist.families.registry import family
from glm_dist.objectives.registry import get_objective
from glm_dist.ops.cross_entropy import cross_entropy, predicted, vocab_split
from glm_dist.parallel.tensor import model_vocab_split, shard_model, shard_vocab

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
cfg = gpt_config("tiny", n_layer=1, d_model=32, n_head=2, vocab_size=300, context_length=32)
whole = GPT(cfg)
padded = GPT(replace(cfg, pad_vocab_to_multiple_of=128))  # 384 rows: rank 1 holds 192..299 and the padding
padded.load_state_dict(whole.state_dict())
with torch.no_grad():
    padded.embed.wte.weight[300:].normal_(0, 3.0)
tied = TiedOutput(padded.cfg)  # a pipeline's last stage, split by its own VOCAB_PLAN
tied.load_state_dict({"wte.weight": padded.embed.wte.weight})
shard_vocab(tied, rank, 2, None, plans={})
spec = family("gpt")
shard_model(padded, rank, 2, None, plans=spec.tensor_plans, vocab_plans=spec.vocab_plans)
split = model_vocab_split(padded)
ids = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
batch = {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}
clm = get_objective("clm")
ref, _ = clm.loss(whole, batch, metrics=False)
(ref_wte,) = torch.autograd.grad(ref, [whole.embed.wte.weight])
with torch.no_grad():  # a pipeline stage's forward, outside the loss's vocab_split
    staged = _logits(tied, whole(batch["input_ids"], project=lambda h, w, b: h), padding=84)
with vocab_split(split):
    loss, _ = clm.loss(padded, batch, metrics=False)
    (wte,) = torch.autograd.grad(loss, [padded.embed.wte.weight])
    with torch.no_grad():
        logits = padded(batch["input_ids"])  # this rank's columns, the padding's at -inf
        given = cross_entropy(logits, batch["labels"], reduction="mean")
        pred = predicted(logits)
        stage_loss = cross_entropy(staged, batch["labels"], reduction="mean")
        stage_pred = predicted(staged)
real = max(0, min(split.end, 300) - split.start)
out = {"rows": [split.start, split.end], "width": logits.shape[-1], "loss": abs(float(loss) - float(ref)),
       "given": abs(float(given) - float(ref)),
       "grad": (wte[:real] - ref_wte[split.start:split.start + real]).abs().max().item(),
       "padding_grad": wte[real:].abs().max().item() if real < wte.shape[0] else 0.0,
       "stage_loss": abs(float(stage_loss) - float(ref)),
       "predicted": bool(torch.equal(pred, whole(batch["input_ids"]).argmax(-1))),
       "stage_predicted": bool(torch.equal(stage_pred, whole(batch["input_ids"]).argmax(-1)))}
with open(f"{sys.argv[1]}/rank{rank}.json", "w") as f:
    json.dump(out, f)
dist.barrier()
dist.destroy_process_group()  # gloo's threads torn down before exit (else "terminate called...", SIGABRT)
"""


def test_vocab_parallel_padding_sits_on_the_last_rank_and_is_left_out(tmp_path):
    """2 gloo ranks, vocabulary 300 padded to 384: each rank 192 rows, the last one 108 real -- the
    model's head, and a pipeline's last stage split the same way."""
    script = tmp_path / "script.py"
    script.write_text(TP_SCRIPT)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(script),
            str(tmp_path),
        ],
        cwd=ROOT,
        env=clean_env(1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rows"] for r in ranks] == [[0, 192], [192, 384]] and ranks[1]["width"] == 192
    for r in ranks:
        assert r["loss"] < 1e-5 and r["given"] < 1e-5 and r["grad"] < 1e-6 and r["padding_grad"] == 0.0
        assert r["predicted"] and r["stage_loss"] < 1e-5 and r["stage_predicted"]
