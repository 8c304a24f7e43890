"""Encoder family parity with transformers: identical random weights, identical outputs (fp32)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from glm_dist.families.bert.hf import from_hf_state_dict, hf_model_class, to_hf_config, to_hf_state_dict
from glm_dist.families.bert.model import Encoder, encoder_config, generator_config

TOL = 1e-4
CASES = {
    "bert": lambda: encoder_config("bert-tiny", vocab_size=600, n_layer=3),
    "roberta": lambda: encoder_config("roberta-tiny", vocab_size=600, n_layer=3),
    "albert": lambda: encoder_config("albert-tiny", vocab_size=600),
    "electra-discriminator": lambda: encoder_config("electra-tiny", vocab_size=600, embedding_size=64),
    "electra-generator": lambda: replace(
        generator_config(encoder_config("electra-tiny", embedding_size=64), fraction=0.5), vocab_size=600
    ),
}


def inputs(cfg):
    torch.manual_seed(1)
    x = torch.randint(5, cfg.vocab_size, (3, 40))
    x[1, -7:] = cfg.pad_id
    attention = (x != cfg.pad_id).long()
    types = torch.zeros_like(x)
    if cfg.type_vocab_size > 1:
        types[:, 15:] = 1
    return dict(input_ids=x, token_type_ids=types, attention_mask=attention)


def compare(ours, hf, cfg):
    batch = inputs(cfg)
    with torch.no_grad():
        o, h = ours(**batch), hf(**batch)
    logits = h.prediction_logits if hasattr(h, "prediction_logits") else h.logits
    real = batch["attention_mask"].bool()
    diff = (o["logits"] - logits)[real].abs().max().item()
    if "sentence_logits" in o:
        sentence = h.seq_relationship_logits if hasattr(h, "seq_relationship_logits") else h.sop_logits
        diff = max(diff, (o["sentence_logits"] - sentence).abs().max().item())
    return diff


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_match_transformers_after_import(case):
    cfg = CASES[case]()
    torch.manual_seed(0)
    hf = hf_model_class(cfg)(to_hf_config(cfg)).eval()
    ours = Encoder(cfg).eval()
    ours.load_state_dict(from_hf_state_dict(hf.state_dict(), list(ours.state_dict()), cfg))
    assert compare(ours, hf, cfg) <= TOL


@pytest.mark.parametrize("case", ["bert", "roberta", "albert", "electra-discriminator", "electra-generator"])
def test_outputs_match_transformers_after_export(case):
    cfg = CASES[case]()
    torch.manual_seed(2)
    ours = Encoder(cfg).eval()
    hf = hf_model_class(cfg)(to_hf_config(cfg)).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict(), cfg), strict=False)
    assert not unexpected
    assert all(
        "position_ids" in k
        or "token_type_ids" in k
        or k.endswith("predictions.bias")
        or k.endswith("lm_head.bias")
        or k.endswith("generator_lm_head.bias")
        for k in missing
    ), missing
    assert compare(ours, hf, cfg) <= TOL


def test_albert_sharing_modes_share_what_they_say():
    all_shared = Encoder(encoder_config("albert-tiny"))
    assert all(b is all_shared.blocks[0] for b in all_shared.blocks)
    attention = Encoder(encoder_config("albert-tiny", share="attention"))
    assert all(b.attn is attention.blocks[0].attn for b in attention.blocks)
    assert attention.blocks[1].ffn is not attention.blocks[0].ffn
    ffn = Encoder(encoder_config("albert-tiny", share="ffn"))
    assert all(b.ffn is ffn.blocks[0].ffn for b in ffn.blocks) and ffn.blocks[1].attn is not ffn.blocks[0].attn
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(all_shared) < n(attention) < n(Encoder(encoder_config("albert-tiny", share="none")))


def test_electra_pair_shares_embeddings_and_weights_the_discriminator_50x():
    from glm_dist.families.bert.model import ElectraPair
    from glm_dist.objectives import electra

    torch.manual_seed(0)
    pair = ElectraPair(encoder_config("electra-tiny", vocab_size=300))
    assert pair.generator.embed.word is pair.discriminator.embed.word
    assert pair.generator.head.mlm.decoder.weight is pair.discriminator.embed.word.weight
    assert pair.generator.cfg.d_model == pair.discriminator.cfg.d_model // 2
    ids = torch.randint(5, 300, (2, 20))
    labels = torch.full_like(ids, -100)
    labels[:, 3:6] = ids[:, 3:6]
    ids[:, 3:6] = 4
    out = pair(ids, labels)
    assert out["disc_targets"][labels == -100].sum() == 0  # only generator samples can differ
    gen_only = torch.nn.functional.cross_entropy(out["gen_logits"].view(-1, 300), labels.view(-1), ignore_index=-100)
    disc = torch.nn.functional.binary_cross_entropy_with_logits(out["disc_logits"], out["disc_targets"])
    total = electra.loss(out["gen_logits"], {"labels": labels}, out["disc_logits"], out["disc_targets"])
    torch.testing.assert_close(total, gen_only + 50 * disc)
    listed = {
        "masked_positions": torch.tensor([[3, 4, 5, 0], [3, 4, 5, 0]]),  # as the loader lists them, padded
        "masked_labels": torch.cat([labels[:, 3:6], torch.full((2, 1), -100)], 1),
    }
    torch.testing.assert_close(
        electra.loss(out["gen_logits"], listed, out["disc_logits"], out["disc_targets"]), gen_only + 50 * disc
    )
