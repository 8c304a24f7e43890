"""GPT-1 (post-LN) against transformers' OpenAIGPT models, GPT's input transformations and head
(glm_dist/transfer), and `glm finetune` from GPT checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import OpenAIGPTConfig, OpenAIGPTDoubleHeadsModel, OpenAIGPTLMHeadModel

from glm_dist.families.gpt1.hf import import_hf, to_hf_config, to_hf_state_dict
from glm_dist.models.common import count_parameters
from glm_dist.families.gpt.model import GPT
from glm_dist.families.gpt1.model import gpt1_config
from glm_dist.families.registry import build_model, published_flavors
from glm_dist.transfer import inputs
from glm_dist.transfer.heads import GPTTransfer
from glm_dist.transfer.inputs import SpecialTokens, pack
from tests.conftest import FAST, ROOT, run_glm

TOL = 1e-4  # max abs difference of fp32 logits
SP = SpecialTokens(100, 101, 102)


def _gpt1(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    cfg = dict(n_layer=2, d_model=64, n_head=4, vocab_size=97, context_length=48) | overrides
    return GPT(gpt1_config("gpt1-tiny", **cfg)).eval()


def test_gpt1_counts_equal_openai_gpt_on_the_meta_device():
    flavor = published_flavors("gpt1")["gpt1"]
    with torch.device("meta"):
        ours = count_parameters(build_model("gpt1", flavor.cfg))
        theirs = OpenAIGPTLMHeadModel(OpenAIGPTConfig()).num_parameters()  # openai-gpt's defaults
    assert ours == theirs == 116_534_784
    assert abs(ours - flavor.params) / flavor.params <= flavor.tol


def test_gpt1_is_post_ln_without_a_final_norm_or_an_embedding_norm():
    model = _gpt1()
    assert isinstance(model.head.ln_f, torch.nn.Identity)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.embed.modules())
    x = torch.randn(1, 5, 64)
    block = model.blocks[0]
    with torch.no_grad():
        h = block.ln_1(x + block.attn(x))
        torch.testing.assert_close(block(x), block.ln_2(h + block.mlp(h)))


def test_gpt1_logits_match_transformers_after_import():
    torch.manual_seed(0)
    hf = OpenAIGPTLMHeadModel(OpenAIGPTConfig(n_layer=3, n_head=4, n_embd=64, vocab_size=512, n_positions=128)).eval()
    cfg, sd = import_hf(hf)
    ours = GPT(cfg).eval()
    ours.load_state_dict(sd)
    x = torch.randint(0, 512, (3, 50))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() <= TOL


def test_gpt1_logits_match_transformers_after_export():
    ours = _gpt1(1, vocab_size=700, context_length=64)
    with torch.no_grad():
        for p in ours.parameters():  # weights larger than the init, so that the outputs vary
            p.add_(torch.randn_like(p) * 0.1)
    hf = OpenAIGPTLMHeadModel(to_hf_config(ours.cfg)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    assert not missing and not unexpected
    x = torch.randint(0, 700, (2, 64))
    with torch.no_grad():
        assert (ours(x) - hf(x).logits).abs().max().item() <= TOL


def _mc_batch(vocab: int) -> dict:
    sp = SpecialTokens.after(vocab)
    context = torch.randint(0, vocab, (2, 9)).tolist()
    answers = [[torch.randint(0, vocab, (n,)).tolist() for n in (3, 5, 4)] for _ in range(2)]
    return pack([inputs.multiple_choice(c, a, sp, 32) for c, a in zip(context, answers)])


def test_multiple_choice_head_matches_openai_gpt_double_heads_after_export():
    lm = _gpt1(2)
    lm.add_tokens(3)
    ours = GPTTransfer(lm, "multiple_choice", 1).eval()
    with torch.no_grad():
        ours.classifier.weight.normal_(0, 0.5)
        ours.classifier.bias.fill_(0.3)
    hf = OpenAIGPTDoubleHeadsModel(to_hf_config(lm.cfg)).eval()
    sd = {k.removeprefix("lm."): v for k, v in ours.state_dict().items()}
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(sd), strict=False)
    assert not missing and not unexpected
    batch = _mc_batch(97)
    with torch.no_grad():
        theirs = hf(batch["input_ids"], mc_token_ids=batch["extract"])
        mine = ours(**batch)
        assert (mine["logits"] - theirs.mc_logits).abs().max().item() <= TOL
        lm_logits = lm(batch["input_ids"].flatten(0, 1)).view(theirs.logits.shape)
        assert (lm_logits - theirs.logits).abs().max().item() <= TOL


def test_multiple_choice_head_matches_openai_gpt_double_heads_after_import():
    torch.manual_seed(3)
    cfg = OpenAIGPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=100, n_positions=48)
    hf = OpenAIGPTDoubleHeadsModel(cfg).eval()
    cfg, sd = import_hf(hf)
    assert {"classifier.weight", "classifier.bias"} <= set(sd)
    ours = GPTTransfer(GPT(cfg), "multiple_choice", 1).eval()
    ours.load_state_dict({("" if k.startswith("classifier.") else "lm.") + k: v for k, v in sd.items()})
    batch = _mc_batch(97)
    with torch.no_grad():
        diff = ours(**batch)["logits"] - hf(batch["input_ids"], mc_token_ids=batch["extract"]).mc_logits
    assert diff.abs().max().item() <= TOL


def test_classification_and_entailment_wrap_the_text_in_start_delimiter_and_extract_tokens():
    assert inputs.classification([5, 6, 7], SP, 16) == [[100, 5, 6, 7, 102]]
    assert inputs.classification(list(range(30)), SP, 8) == [[100, *range(6), 102]]
    assert inputs.entailment([1, 2], [3], SP, 16) == [[100, 1, 2, 101, 3, 102]]
    # too long: the longer segment is cut first, keeping the premise's end and the hypothesis' start
    assert inputs.entailment(list(range(10)), [50, 51, 52], SP, 10) == [[100, 6, 7, 8, 9, 101, 50, 51, 52, 102]]


def test_similarity_reads_both_orders_and_sums_their_final_states():
    assert inputs.similarity([1, 2], [3], SP, 16) == [[100, 1, 2, 101, 3, 102], [100, 3, 101, 1, 2, 102]]
    lm = _gpt1(4)
    lm.add_tokens(3)
    model = GPTTransfer(lm, "similarity", 3).eval()
    a, b = [5, 6, 7, 8], [9, 10]
    ab = pack([inputs.similarity(a, b, SpecialTokens.after(97), 32)])
    ba = pack([inputs.similarity(b, a, SpecialTokens.after(97), 32)])
    assert ab["input_ids"].shape == (1, 2, 9)
    with torch.no_grad():
        out = model(**ab)["logits"]
        h = model.hidden_states(ab["input_ids"][0])  # (2, T, C)
        summed = h[0, ab["extract"][0, 0]] + h[1, ab["extract"][0, 1]]
        torch.testing.assert_close(out[0], model.classifier(summed))
        torch.testing.assert_close(out, model(**ba)["logits"])  # the order of the pair does not matter
        assert not torch.allclose(out[0], model.classifier(2 * h[0, ab["extract"][0, 0]]))


def test_multiple_choice_scores_each_candidate_and_takes_the_softmax_over_candidates():
    seqs = inputs.multiple_choice([1, 2], [[3], [4, 5]], SP, 16)
    assert seqs == [[100, 1, 2, 101, 3, 102], [100, 1, 2, 101, 4, 5, 102]]
    lm = _gpt1(5)
    lm.add_tokens(3)
    model = GPTTransfer(lm, "multiple_choice", 1).eval()
    sp = SpecialTokens.after(97)
    batch = pack(
        [
            inputs.multiple_choice([7, 8, 9], [[10], [11, 12], [13]], sp, 32),
            inputs.multiple_choice([7, 8], [[14], [15]], sp, 32),
        ]
    )  # two candidates: one filler
    assert batch["input_ids"].shape == (2, 3, 8) and batch["extract"].tolist() == [[6, 7, 6], [5, 5, 0]]
    with torch.no_grad():
        logits = model(**batch)["logits"]
        one = model(**pack([inputs.multiple_choice([7, 8, 9], [[13], [10], [11, 12]], sp, 32)]))["logits"]
    assert logits.shape == (2, 3) and logits[1, 2] == float("-inf")
    torch.testing.assert_close(one[0], logits[0, [2, 0, 1]])  # candidates permuted -> scores permuted
    probs = logits.softmax(-1)
    assert probs[1, 2] == 0 and torch.allclose(probs.sum(-1), torch.ones(2))
    loss = model.loss({"logits": logits, "lm_loss": torch.tensor(2.0)}, torch.tensor([1, 0]), 0.5)
    assert loss.item() == pytest.approx((-probs[0, 1].log() - probs[1, 0].log()).item() / 2 + 1.0, rel=1e-5)


def test_new_tokens_grow_the_tied_embedding_and_keep_the_pretrained_rows():
    lm = _gpt1(6)
    x = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        before = lm(x)
    assert lm.add_tokens(3) == 97
    assert lm.embed.wte.weight.shape == (100, 64) and lm.head.lm_head.weight is lm.embed.wte.weight
    with torch.no_grad():
        after = lm(x)
    torch.testing.assert_close(after[..., :97], before)
    assert after.shape[-1] == 100 and lm.cfg.vocab_size == 100


def test_new_tokens_take_the_padding_rows_of_a_padded_vocabulary_and_grow_it_past_them():
    """97 tokens padded to 128 rows: 3 new ones take rows 97..99 of the same matrix; 30 more do not
    fit the 28 left and grow it to 256 rows, padded again with zeros; the LM's logits stay the real
    vocabulary's and the pretrained rows' scores do not move."""
    lm = _gpt1(8, pad_vocab_to_multiple_of=128)
    x = torch.randint(0, 97, (1, 10))
    with torch.no_grad():
        before = lm(x)
    storage, params = lm.embed.wte.weight.data_ptr(), count_parameters(lm)
    padding = lm.embed.wte.weight[97:100].detach().clone()
    assert lm.add_tokens(3) == 97
    weight = lm.embed.wte.weight
    assert weight.shape == (128, 64) and weight.data_ptr() == storage and lm.head.lm_head.weight is weight
    assert lm.cfg.vocab_size == 100 and lm.head.padding_columns == 28 and count_parameters(lm) == params + 3 * 64
    assert not torch.equal(weight[97:100], padding)  # drawn afresh
    with torch.no_grad():
        after = lm(x)
    assert after.shape[-1] == 100
    torch.testing.assert_close(after[..., :97], before)
    new_rows = weight[97:100].detach().clone()
    assert lm.add_tokens(30) == 100
    weight = lm.embed.wte.weight
    assert weight.shape == (256, 64) and lm.head.lm_head.weight is weight and lm.cfg.vocab_size == 130
    assert torch.equal(weight[97:100], new_rows) and torch.equal(weight[130:], torch.zeros(126, 64))
    assert count_parameters(lm) == params + 33 * 64 and lm.head.padding_columns == 126
    with torch.no_grad():
        grown = lm(x)
    assert grown.shape[-1] == 130
    torch.testing.assert_close(grown[..., :97], before)


def test_the_lm_loss_is_the_mean_next_token_loss_over_the_real_tokens():
    lm = _gpt1(7)
    lm.add_tokens(3)
    model = GPTTransfer(lm, "classify", 2).eval()
    batch = pack(
        [
            inputs.classification([1, 2, 3, 4], SpecialTokens.after(97), 16),
            inputs.classification([5, 6], SpecialTokens.after(97), 16),
        ]
    )
    with torch.no_grad():
        got = model(**batch)["lm_loss"]
        nll = [
            torch.nn.functional.cross_entropy(lm(ids[None, :n])[0, :-1], ids[1:n], reduction="sum")
            for ids, n in zip(batch["input_ids"][:, 0], batch["lengths"][:, 0])
        ]
    torch.testing.assert_close(got, sum(nll) / (5 + 3))


def test_recipes_fill_in_options_the_command_line_does_not_give():
    from glm_dist.transfer.options import FinetuneError
    from glm_dist.transfer.recipes import finetune_args, load_recipe

    args = finetune_args({"checkpoint": "c", "train": "t", "recipe": "gpt", "epochs": 1, "lr": None})
    assert (args.lr, args.batch_size, args.epochs, args.warmup, args.lm_weight, args.dropout) == (
        6.25e-5,
        32,
        1,
        0.002,
        0.5,
        0.1,
    )
    assert finetune_args({"checkpoint": "c", "train": "t"}).lr == 5e-5  # no recipe: the defaults
    with pytest.raises(FinetuneError, match="no fine-tuning recipe 'bert'"):
        load_recipe("bert")


def test_a_recipe_file_with_an_unknown_key_is_refused(tmp_path):
    from glm_dist.transfer.options import FinetuneError
    from glm_dist.transfer.recipes import load_recipe

    (tmp_path / "r.yaml").write_text("lr: 1e-3\nlearning_rate: 2\n")
    with pytest.raises(FinetuneError, match="unknown recipe key 'learning_rate'"):
        load_recipe(str(tmp_path / "r.yaml"))
    (tmp_path / "r.yaml").write_text("lr: 1e-3\n")
    assert load_recipe(str(tmp_path / "r.yaml")) == {"lr": 1e-3}  # YAML's string "1e-3" read as the float


def _pretrain(family_config: str, shards_dir: str, out, steps: int) -> str:
    run_glm(
        [
            "train",
            "-c",
            str(ROOT / f"configs/experiments/{family_config}-tiny-cpu.yaml"),
            *FAST,
            f"data.shards_dir={shards_dir}",
            "data.vocab_size=2048",
            "model.vocab_size=2048",
            f"train.max_steps={steps}",
            f"train.out_dir={out}",
        ]
    )
    return str(out / f"checkpoints/step_{steps:08d}")


def _result(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.mark.slow
def test_a_gpt1_checkpoint_exports_to_openai_gpt_and_fine_tunes_multiple_choice(shards_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_pipeline.tasks.docstring_mc import build
    from glm_dist.eval.run import load_checkpoint_model

    from glm_dist.hf.export import export_checkpoint  # what glm export-hf runs

    ckpt = _pretrain("gpt1", shards_dir, tmp_path / "pre", 30)
    export_checkpoint(ckpt, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert isinstance(hf, OpenAIGPTLMHeadModel) and (tmp_path / "hf/model.safetensors").exists()
    ours, _ = load_checkpoint_model(ckpt)
    ids = tok("Return the number of items in a container.", return_tensors="pt").input_ids
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= TOL

    rows = build().splits["train"]  # {"text", "choices": five module names, "label": index}
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _result(
        run_glm(
            [
                "finetune",
                "--recipe",
                "gpt",
                "--task",
                "multiple_choice",
                "--checkpoint",
                ckpt,
                "--train",
                str(tmp_path / "mc.jsonl"),
                "--epochs",
                "1",
                "--batch-size",
                "8",
            ]
        )
    )
    assert result["task"] == "multiple_choice" and len(result["labels"]) == 5 and result["valid_examples"] > 0
    assert result["settings"] | {"epochs": 1, "batch_size": 8} == {
        "lr": 6.25e-5,
        "batch_size": 8,
        "epochs": 1,
        "warmup": 0.002,
        "lm_weight": 0.5,
        "dropout": 0.1,
        "max_len": 128,
        # GPT's recipe uses none of ULMFiT's tricks (glm_dist/transfer/tricks.py): off by default
        "schedule": "linear",
        "discriminative_lr": 0.0,
        "gradual_unfreezing": False,
        "adapters": 0,
        "layer_groups": 4,
    }


@pytest.mark.slow
def test_gpt2_fine_tuned_on_docstrings_beats_the_majority_baseline(shards_dir, tmp_path):
    from data_pipeline.embedded import docstring_task  # what glm data docstring-task writes

    ckpt = _pretrain("gpt2", shards_dir, tmp_path / "pre", 60)
    (tmp_path / "task.jsonl").write_text("".join(json.dumps(r) + "\n" for r in docstring_task()))
    result = _result(
        run_glm(
            [
                "finetune",
                "--checkpoint",
                ckpt,
                "--train",
                str(tmp_path / "task.jsonl"),
                "--epochs",
                "8",
                "--lr",
                "3e-3",
                "--out",
                str(tmp_path / "ft"),
            ]
        )
    )
    assert result["labels"] == ["calendar", "math", "shutil", "tarfile", "urllib.parse"]
    assert result["settings"]["lm_weight"] == 0.5  # GPT's auxiliary LM loss is on by default
    assert result["valid_accuracy"] >= result["majority_baseline"] + 0.1, result  # measured 0.77 vs 0.48
    assert (tmp_path / "ft/model.safetensors").exists() and (tmp_path / "ft/finetune.json").exists()
