"""Parity with transformers' GPT2LMHeadModel: identical random weights give identical logits."""
from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from glm_dist.hf.gpt2 import export_hf, import_hf, to_hf_config, to_hf_state_dict
from glm_dist.models.gpt import GPT, gpt_config

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
