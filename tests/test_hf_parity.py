"""Parity with transformers' GPT2LMHeadModel: identical random weights give identical logits."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from glm_dist.families.gpt.hf import export_hf, import_hf, to_hf_config, to_hf_state_dict
from glm_dist.families.gpt.model import GPT, gpt_config

TOL = 1e-4  # max abs difference of fp32 logits


def test_logits_match_transformers_after_import():
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=3, n_head=4, n_embd=64, vocab_size=512, n_positions=128)).eval()
    cfg, sd = import_hf(hf)
    ours = GPT(cfg).eval()
    ours.load_state_dict(sd)
    x = torch.randint(0, 512, (3, 50))
    with torch.no_grad():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    assert diff <= TOL, diff


def test_logits_match_transformers_after_export():
    torch.manual_seed(1)
    ours = GPT(gpt_config("tiny", n_layer=2, d_model=96, n_head=6, vocab_size=700, context_length=64)).eval()
    hf = GPT2LMHeadModel(to_hf_config(ours.cfg)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    assert not unexpected and all(k.endswith(("attn.bias", "attn.masked_bias")) for k in missing)
    x = torch.randint(0, 700, (2, 64))
    with torch.no_grad():
        diff = (ours(x) - hf(x).logits).abs().max().item()
    assert diff <= TOL, diff


def test_exported_folder_loads_and_generates_like_our_greedy_decoding(tmp_path, shards_dir):
    from transformers import AutoTokenizer

    torch.manual_seed(2)
    ours = GPT(gpt_config("tiny", n_layer=2, d_model=64, vocab_size=2048, context_length=64)).eval()
    export_hf(ours.cfg, ours.state_dict(), str(tmp_path), tokenizer_file=f"{shards_dir}/tokenizer.json")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok("def open(file, mode='r')", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "def open(file, mode='r')"
    out = hf.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)
    seq = ids
    with torch.no_grad():
        for _ in range(12):
            seq = torch.cat([seq, ours(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out[0].tolist() == seq[0].tolist()
    assert isinstance(tok.decode(out[0]), str)


def _varied_gpt():
    """A random tiny GPT whose outputs vary (larger weights than the init), with its transformers twin."""
    torch.manual_seed(5)
    ours = GPT(gpt_config("tiny", n_layer=2, d_model=64, vocab_size=40, context_length=64)).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    hf = GPT2LMHeadModel(to_hf_config(ours.cfg, eot_id=3)).eval()
    hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    return ours, hf


@pytest.mark.parametrize("strategy,beams", [("greedy", 1), ("beam", 4)])
def test_cached_generation_matches_transformers_generate(strategy, beams):
    from glm_dist.models.generate import GenerationConfig, generate

    ours, hf = _varied_gpt()
    x = torch.randint(4, 40, (3, 6))
    for eos in (3, int(generate(ours, x, GenerationConfig(max_new_tokens=4))[0, 8])):  # one that does occur
        mine = generate(ours, x, GenerationConfig(max_new_tokens=12, strategy=strategy, num_beams=beams, eos_id=eos))
        theirs = hf.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=12,
            do_sample=False,
            num_beams=beams,
            early_stopping=True,
            pad_token_id=eos,
            eos_token_id=eos,
            length_penalty=1.0,
        )
        n = min(mine.shape[1], theirs.shape[1])
        assert torch.equal(mine[:, :n], theirs[:, :n]), (eos, mine, theirs)
    assert len(set(map(tuple, mine[:, 6:].tolist()))) > 1  # the continuations differ: not a degenerate model


def test_cache_gives_the_logits_of_a_full_forward_pass():
    ours, _ = _varied_gpt()
    x = torch.randint(4, 40, (2, 12))
    cache = [{} for _ in ours.blocks]
    with torch.no_grad():
        parts = [ours(x[:, :5], cache)] + [ours(x[:, i : i + 1], cache) for i in range(5, 12)]
        torch.testing.assert_close(torch.cat(parts, 1), ours(x), atol=1e-5, rtol=1e-5)


def test_sampling_respects_top_k_top_p_and_the_seed():
    from glm_dist.models.generate import GenerationConfig, filter_logits, generate

    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    kept = torch.isfinite(filter_logits(logits, GenerationConfig(top_k=3)))
    assert kept.tolist() == [[True, True, True, False, False, False]]
    probs = logits.softmax(-1)[0]
    nucleus = torch.isfinite(filter_logits(logits, GenerationConfig(top_p=0.9)))[0]
    assert probs[nucleus].sum() >= 0.9 and probs[nucleus][:-1].sum() < 0.9  # smallest set reaching p
    ours, _ = _varied_gpt()
    x = torch.randint(4, 40, (4, 5))
    cfg = GenerationConfig(max_new_tokens=20, strategy="sample", top_k=5, seed=11)
    a, b = generate(ours, x, cfg), generate(ours, x, cfg)
    assert torch.equal(a, b) and not torch.equal(
        a, generate(ours, x, GenerationConfig(max_new_tokens=20, strategy="sample", top_k=5, seed=12))
    )
    with torch.no_grad():  # every sampled token was among the top 5 at its step
        logits_all = ours(a[:, :-1])[:, 4:]
    top5 = logits_all.topk(5, -1).indices
    assert (top5 == a[:, 5:, None]).any(-1).all()
