"""XLNet: published sizes, two-stream attention, memory and padding, and parity with transformers'
XLNetLMHeadModel in both directions (identical weights, fp32 logits within 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import XLNetLMHeadModel

from glm_dist.families.xlnet.hf import export_hf, import_hf, to_hf_config, to_hf_state_dict
from glm_dist.models.common import count_parameters
from glm_dist.families.xlnet.model import FLAVORS, XLNet, xlnet_config
from glm_dist.objectives.permutation_lm import plm_inputs
from glm_dist.objectives.registry import collate

TOL = 1e-4  # max abs difference of fp32 logits
VOCAB, B, T = 120, 4, 12
SPECIALS = np.arange(8)  # the xlnet profile's <unk> <s> </s> <cls> <sep> <pad> <mask> <eod>
PAD = 5


def small(**overrides):
    return xlnet_config("xlnet-tiny", **{"vocab_size": VOCAB, "d_model": 32, "n_head": 4, "d_ff": 64, **overrides})


def vary(model: torch.nn.Module) -> None:
    """Noise on every weight, so attention is far from uniform and logits spread (std ~0.6)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)


def twins(cfg, direction: str) -> tuple[XLNet, XLNetLMHeadModel]:
    """Our model and transformers', sharing one set of random weights made on one side."""
    torch.manual_seed(0)
    if direction == "import":  # ours <- transformers' weights
        hf = XLNetLMHeadModel(to_hf_config(cfg))
        vary(hf)
        cfg, sd = import_hf(hf)
        ours = XLNet(cfg)
        ours.load_state_dict(sd)
    else:  # transformers <- our weights
        ours = XLNet(cfg)
        vary(ours)
        hf = XLNetLMHeadModel(to_hf_config(cfg))
        hf.load_state_dict(to_hf_state_dict(ours.state_dict(), cfg))  # strict: every name maps
    return ours.eval(), hf.eval()


def plm_batch(x: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """The ``plm`` objective's perm_mask and target_mapping for each row of ``x``."""
    rng = np.random.default_rng(seed)
    rows = [plm_inputs(row.numpy(), rng, special_ids=SPECIALS) for row in x]
    return {k: v for k, v in collate(rows, pad_id=0).items() if k in ("perm_mask", "target_mapping")}


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(8, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))


def left_padded(x: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.clone()
    mask = torch.ones_like(x)
    for row, n in ((1, 4), (3, 2)):
        x[row, :n], mask[row, :n] = PAD, 0
    return {"input_ids": x, "attention_mask": mask}


def segments(x: torch.Tensor) -> torch.Tensor:
    types = torch.zeros_like(x)
    types[:, 5:] = 1
    types[:, -1] = 2  # <cls>'s own segment, as XLNet's tokenizer gives it
    return types


CASES = {  # name -> (config overrides, inputs from tokens)
    "plain": ({}, lambda x: {"input_ids": x}),
    "plm": ({}, lambda x: {"input_ids": x, **plm_batch(x)}),
    "left_padding": ({}, left_padded),
    "left_padding_plm": ({}, lambda x: {**left_padded(x), **plm_batch(x)}),
    "segments_plm": ({}, lambda x: {"input_ids": x, "token_type_ids": segments(x), **plm_batch(x)}),
    "bi_data_plm": ({"bi_data": True}, lambda x: {"input_ids": x, **plm_batch(x)}),
    "clamp_len_plm": ({"clamp_len": 3}, lambda x: {"input_ids": x, **plm_batch(x)}),
    # transformers' uni attention fails with any perm_mask or attention_mask (an in-place broadcast)
    "uni": ({"attn_type": "uni"}, lambda x: {"input_ids": x, "token_type_ids": segments(x)}),
}


@pytest.mark.parametrize("direction", ["import", "export"])
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case, direction):
    overrides, make = CASES[case]
    ours, hf = twins(small(**overrides), direction)
    batch = make(tokens())
    with torch.no_grad():
        mine, theirs = ours(**batch), hf(**batch)
    P = batch["target_mapping"].shape[1] if "target_mapping" in batch else T
    assert mine["logits"].shape == (B, P, VOCAB)
    diff = (mine["logits"] - theirs.logits).abs().max().item()
    assert diff <= TOL, diff
    if "target_mapping" not in batch:  # the content stream is what a fine-tuning head reads
        states = hf.transformer(**batch).last_hidden_state
        assert (ours.encode(**batch) - states).abs().max().item() <= TOL


@pytest.mark.parametrize("direction", ["import", "export"])
@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_memory_over_two_segments_matches_transformers(attn_type, direction):
    # reuse_len 8 < T: a segment caches its first 8 positions; mem_len 10 then cuts the second's memory
    ours, hf = twins(small(mem_len=10, reuse_len=8, attn_type=attn_type), direction)
    first, second = tokens(1), tokens(2)
    extra = plm_batch if attn_type == "bi" else (lambda x: {})
    with torch.no_grad():
        a1, h1 = ours(first, **extra(first)), hf(first, use_mems=True, **extra(first))
        a2 = ours(second, mems=a1["mems"], **extra(second))
        h2 = hf(second, mems=h1.mems, use_mems=True, **extra(second))
    assert [m.shape for m in a1["mems"]] == [(B, 8, 32)] * 2 and [m.shape for m in a2["mems"]] == [(B, 10, 32)] * 2
    for mine, theirs in ((a1, h1), (a2, h2)):
        assert (mine["logits"] - theirs.logits).abs().max().item() <= TOL
        for m, t in zip(mine["mems"], theirs.mems):  # ours (B, M, d), transformers' (M, B, d)
            assert (m - t.transpose(0, 1)).abs().max().item() <= TOL
    with torch.no_grad():  # the memory is used: without it the second segment reads differently
        assert (ours(second, **extra(second))["logits"] - a2["logits"]).abs().max().item() > 1e-2


def test_padding_never_changes_a_real_sequence():
    torch.manual_seed(0)
    model = XLNet(small())
    vary(model)
    model.eval()
    lengths = (12, 8, 6)
    rows = [torch.randint(8, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    x, mask = torch.full((3, T), PAD), torch.zeros(3, T, dtype=torch.long)
    perm, target = torch.zeros(3, T, T), torch.eye(T).repeat(3, 1, 1)
    alone = []
    for b, row in enumerate(rows):
        n = len(row)
        x[b, T - n :], mask[b, T - n :] = row, 1
        plm = plm_batch(row[None], seed=b)
        perm[b, T - n :, T - n :] = plm["perm_mask"][0]
        with torch.no_grad():
            every = {"perm_mask": plm["perm_mask"], "target_mapping": torch.eye(n)[None]}  # query at every position
            alone.append((model(row[None])["logits"][0], model(row[None], **every)["logits"][0]))
    with torch.no_grad():
        content = model(x, attention_mask=mask)["logits"]
        query = model(x, attention_mask=mask, perm_mask=perm, target_mapping=target)["logits"]
        unmasked = model(x)["logits"]
    for b, (n, (c, q)) in enumerate(zip(lengths, alone)):
        assert (content[b, T - n :] - c).abs().max().item() <= TOL
        assert (query[b, T - n :] - q).abs().max().item() <= TOL
    assert (unmasked[2, T - 6 :] - alone[2][0]).abs().max().item() > 1e-2  # without the mask, padding leaks in


def factorisation_mask(targets: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """XLNet's perm_mask (T, T): i may not see a target j unless j comes earlier in the order;
    context tokens come first (order -1) and are seen by everyone."""
    rank = torch.where(targets, order, -1)
    return ((rank[:, None] <= rank[None, :]) & targets[None, :]).float()


def test_query_stream_predicts_a_token_without_seeing_it():
    torch.manual_seed(0)
    model = XLNet(small(n_layer=3))
    vary(model)
    model.eval()
    x = tokens()[:1]
    targets = torch.zeros(T, dtype=torch.bool)
    targets[[2, 3, 7, 10]] = True
    order = torch.randperm(T, generator=torch.Generator().manual_seed(0))
    plm = {"perm_mask": factorisation_mask(targets, order)[None], "target_mapping": torch.eye(T)[None]}
    changed = x.clone()
    changed[0, targets] = (x[0, targets] + 1 - 8) % (VOCAB - 8) + 8
    with torch.no_grad():
        base, own = model(x, **plm), model(changed, **plm)
    shown = {}
    for t in torch.nonzero(targets).flatten().tolist():
        ids = changed.clone()  # only target t shows its original token
        ids[0, t] = x[0, t]
        with torch.no_grad():
            shown[t] = model(ids, **plm)
        torch.testing.assert_close(shown[t]["logits"][0, t], own["logits"][0, t])  # its own token is never read
        # ... while the content stream reads it
        assert (shown[t]["hidden_states"][0, t] - own["hidden_states"][0, t]).abs().max() > 1e-2
    torch.testing.assert_close(base["logits"][0, ~targets], own["logits"][0, ~targets])  # context never sees a target
    first, last = sorted(shown, key=lambda t: order[t])[:: len(shown) - 1]
    # a later target in the order reads an earlier one
    assert (shown[first]["logits"][0, last] - own["logits"][0, last]).abs().max() > 1e-2


def test_gradients_do_not_flow_into_memory():
    torch.manual_seed(0)
    model = XLNet(small(mem_len=6)).train()  # dropout 0: train mode, deterministic
    first, second = tokens(1), tokens(2)
    mems = model(first, token_type_ids=segments(first), **plm_batch(first))["mems"]
    assert all(not m.requires_grad and m.grad_fn is None for m in mems)
    params = list(model.parameters())

    def grads(memory):
        out = model(second, mems=memory, token_type_ids=segments(second), **plm_batch(second))
        return torch.autograd.grad(out["logits"].pow(2).mean(), params)

    for g, ref in zip(grads(mems), grads([m.clone() for m in mems])):
        torch.testing.assert_close(g, ref)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = XLNet(small()).train()
    batch = {"input_ids": tokens(), "token_type_ids": segments(tokens()), **plm_batch(tokens())}  # every weight used
    model(**batch)["logits"].sum().backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.activation_checkpointing = True
    model(**batch)["logits"].sum().backward()
    for p, g in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, g)


@pytest.mark.parametrize("name", ["xlnet-base", "xlnet-large"])
def test_published_counts_equal_transformers_exactly(name):
    flavor = FLAVORS[name]
    with torch.device("meta"):
        ours = count_parameters(XLNet(flavor.cfg))
        theirs = XLNetLMHeadModel(to_hf_config(flavor.cfg)).num_parameters()
    assert ours == theirs
    assert abs(ours - flavor.params) / flavor.params <= flavor.tol, f"{name}: {ours:,} vs {flavor.params:,.0f}"


def test_config_refuses_what_it_cannot_build():
    with pytest.raises(KeyError, match="unknown XLNet flavor 'xlnet-huge'"):
        xlnet_config("xlnet-huge")
    with pytest.raises(ValueError, match="n_head=5 must divide d_model=32"):
        small(n_head=5)
    with pytest.raises(ValueError, match="batch size 3 is odd"):
        XLNet(small(bi_data=True))(tokens()[:3])


DOCS = [
    "The permutation objective predicts every token from a random subset of the others.",
    "Relative positions let the model read a segment together with the memory of the last one.",
    "Two streams share their weights: the content stream sees the token, the query stream does not.",
    "Padding goes on the left, and the classification token is the last token of the sequence.",
] * 20


def test_exported_folder_loads_with_its_tokenizer_and_matches_our_outputs(tmp_path):
    from transformers import AutoTokenizer

    from data_pipeline.tokenize.profiles import train_tokenizer

    tokenizer = train_tokenizer("xlnet", DOCS, vocab_size=200)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    torch.manual_seed(3)
    ours = XLNet(small(vocab_size=tokenizer.get_vocab_size()))
    vary(ours)
    ours.eval()
    export_hf(ours.cfg, ours.state_dict(), str(tmp_path / "hf"), tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert (tmp_path / "hf" / "model.safetensors").exists()
    hf = XLNetLMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompts = ["the query stream", "the model reads the memory of the last segment"]
    batch = tok(prompts, padding=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "attention_mask"} and batch["attention_mask"][0, 0] == 0  # left padding
    assert (batch["input_ids"][:, -2:] == torch.tensor([tok.sep_token_id, tok.cls_token_id])).all()  # <cls> last
    assert tok.decode(batch["input_ids"][1], skip_special_tokens=True) == prompts[1]
    assert hf.config.pad_token_id == tok.pad_token_id == PAD
    n = batch["input_ids"].shape[1]
    perm = torch.zeros(2, n, n)
    perm[:, :, -3] = 1  # nobody sees the last word: predict it from the rest
    target = torch.zeros(2, 1, n)
    target[:, 0, -3] = 1
    with torch.no_grad():
        for extra in ({}, {"perm_mask": perm, "target_mapping": target}):
            diff = (ours(**batch, **extra)["logits"] - hf(**batch, **extra).logits).abs().max().item()
            assert diff <= TOL, (extra.keys(), diff)
