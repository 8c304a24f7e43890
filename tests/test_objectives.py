"""Objectives against their published parameters, on real shards of the embedded corpus, with
each family's tokenizer. Rates are measured over thousands of sequences."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from glm_dist.data.loader import Loader
from glm_dist.objectives import denoising, electra, mlm, span_corruption
from glm_dist.objectives.mlm import IGNORE_INDEX, MaskingOptions
from glm_dist.objectives.registry import get_objective


def batches(shards_dir, objective, *, n_steps, seq_len=128, micro=32, options=None, seed=3):
    ld = Loader(shards_dir, objective=objective, seq_len=seq_len, micro_batch_size=micro, seed=seed, options=options)
    return ld, [ld.next_step()[0] for _ in range(n_steps)]


# -- MLM ---------------------------------------------------------------------------------------------
def mlm_stats(inputs, labels, originals, mask_id):
    chosen = labels != IGNORE_INDEX
    n = chosen.sum()
    return {
        "masked": (inputs[chosen] == mask_id).sum() / n,
        "random": ((inputs[chosen] != mask_id) & (inputs[chosen] != originals[chosen])).sum() / n,
        "kept": (inputs[chosen] == originals[chosen]).sum() / n,
    }


def test_mlm_selects_15_percent_split_80_10_10_and_never_specials(shards):
    ld, bs = batches(shards("roberta"), "mlm", n_steps=40)
    specials = ld.vocab.specials
    inputs = torch.cat([b["input_ids"] for b in bs]).numpy()
    labels = torch.cat([b["labels"] for b in bs]).numpy()
    originals = np.where(labels != IGNORE_INDEX, labels, inputs)
    maskable = ~np.isin(originals, specials)
    rate = (labels != IGNORE_INDEX).sum() / maskable.sum()
    assert rate == pytest.approx(0.15, abs=0.005)
    split = mlm_stats(inputs, labels, originals, ld.vocab.id("mask"))
    assert split["masked"] == pytest.approx(0.8, abs=0.01)
    assert split["random"] == pytest.approx(0.1, abs=0.01)
    assert split["kept"] == pytest.approx(0.1, abs=0.01)
    assert not (labels[np.isin(originals, specials)] != IGNORE_INDEX).any()
    assert (inputs[:, 0] == ld.vocab.id("cls")).all()  # <s> ... </s> framing kept
    assert not np.isin(inputs[(labels != IGNORE_INDEX) & (inputs != ld.vocab.id("mask"))], specials).any()


def test_mlm_matches_transformers_collator_distributionally(shards):
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    d = shards("roberta")
    tok = PreTrainedTokenizerFast(
        tokenizer_file=f"{d}/tokenizer.json",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        cls_token="<s>",
        sep_token="</s>",
    )
    ld, bs = batches(d, "mlm", n_steps=30)
    ours_in = torch.cat([b["input_ids"] for b in bs])
    ours_lab = torch.cat([b["labels"] for b in bs])
    originals = torch.where(ours_lab != IGNORE_INDEX, ours_lab, ours_in)
    torch.manual_seed(0)
    hf = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)([{"input_ids": o} for o in originals.tolist()])
    ours, theirs = (
        mlm_stats(i.numpy(), lab.numpy(), originals.numpy(), ld.vocab.id("mask"))
        for i, lab in ((ours_in, ours_lab), (hf["input_ids"], hf["labels"]))
    )
    rate_ours = (ours_lab != IGNORE_INDEX).float().mean().item()
    rate_hf = (hf["labels"] != IGNORE_INDEX).float().mean().item()
    assert rate_ours == pytest.approx(rate_hf, abs=0.005)
    for key in ("masked", "random", "kept"):
        assert ours[key] == pytest.approx(theirs[key], abs=0.015), key
    # Ours hits the rate on every sequence (BERT's round(rate * n)); the collator's is Binomial.
    per_seq = (ours_lab != IGNORE_INDEX).float().mean(1)
    assert per_seq.std() < (hf["labels"] != IGNORE_INDEX).float().mean(1).std()


def test_masks_change_every_epoch_and_replay_on_resume(shards):
    d = shards("roberta")
    ld = Loader(d, objective="mlm", seq_len=64, micro_batch_size=8, seed=1)
    first = [ld.next_step()[0] for _ in range(3)]
    state = ld.state_dict()
    after = [ld.next_step()[0] for _ in range(3)]
    resumed = Loader(d, objective="mlm", seq_len=64, micro_batch_size=8, seed=1)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    for a, b in zip(after, [resumed.next_step()[0] for _ in range(3)]):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    unit = np.arange(10, 138)
    epoch0 = get_objective("clm").sample(
        unit, np.random.default_rng([1, 0, 0]), vocab=ld.vocab, opts=get_objective("clm").options()
    )
    assert epoch0["input_ids"].shape == (127,)
    opts = get_objective("mlm").options()
    m0 = get_objective("mlm").sample(
        (unit, np.array([0])), np.random.default_rng([1, 1, 0, 0, 5]), vocab=ld.vocab, opts=opts
    )
    m1 = get_objective("mlm").sample(
        (unit, np.array([0])), np.random.default_rng([1, 1, 1, 1, 5]), vocab=ld.vocab, opts=opts
    )
    assert not np.array_equal(m0["labels"], m1["labels"])  # same text, new epoch, new mask
    assert first[0]["input_ids"].shape[0] == 8 and first[0]["input_ids"].shape[1] <= 64  # FULL-SENTENCES: <= max


def test_whole_word_masking_masks_all_pieces_of_a_word_together(shards):
    opts = MaskingOptions(whole_word=True)
    ld, bs = batches(shards("bert"), "mlm", n_steps=20, options=opts)
    starts = ld.vocab.word_starts
    broken = total = 0
    for b in bs:
        labels = b["labels"].numpy()
        originals = np.where(labels != IGNORE_INDEX, labels, b["input_ids"].numpy())
        for row, lab in zip(originals, labels):
            special = np.isin(row, ld.vocab.specials)
            # A token right after a special token starts a word (a unit cut inside a long sentence
            # can begin with a continuation piece).
            is_start = starts[row] | special | np.concatenate([[True], special[:-1]])
            word_id = np.cumsum(is_start)
            chosen = lab != IGNORE_INDEX
            for w in np.unique(word_id[chosen]):
                total += 1
                broken += not chosen[word_id == w].all()
    assert total > 1000 and broken == 0
    labels = torch.cat([b["labels"] for b in bs]).numpy()
    originals = np.where(labels != IGNORE_INDEX, labels, torch.cat([b["input_ids"] for b in bs]).numpy())
    maskable = ~np.isin(originals, ld.vocab.specials)
    # A word that would overshoot the per-sequence budget is skipped (google-research/bert does the
    # same), so whole-word selection lands near 15% (round(0.15 n) per sequence).
    assert 0.14 <= (labels != IGNORE_INDEX).sum() / maskable.sum() <= 0.155


def test_albert_ngram_lengths_follow_one_over_n():
    draws = mlm.draw_ngram_lengths(np.random.default_rng(0), 200_000, 3)
    freq = np.bincount(draws, minlength=4)[1:] / len(draws)
    np.testing.assert_allclose(freq, [6 / 11, 3 / 11, 2 / 11], atol=0.01)


def test_ngram_spans_never_cross_or_select_special_tokens():
    rng = np.random.default_rng(0)
    cfg = MaskingOptions(max_ngram=3)
    specials = np.array([0, 1, 2, 3, 4])
    for _ in range(2000):
        tokens = rng.integers(5, 100, size=64)
        tokens[rng.choice(64, size=6, replace=False)] = rng.choice(specials, size=6)  # separators inside
        _, labels = mlm.mask_tokens(tokens, rng, cfg=cfg, mask_id=4, vocab_size=100, special_ids=specials)
        assert not np.isin(tokens[labels != IGNORE_INDEX], specials).any()


def test_sop_pairs_are_consecutive_segments_swapped_half_the_time(shards):
    ld, bs = batches(shards("albert"), "sop", n_steps=100, seq_len=128)
    labels = torch.cat([b["sentence_label"] for b in bs]).float()  # 3200 pairs: std of the mean 0.009
    assert labels.mean().item() == pytest.approx(0.5, abs=0.035)
    b = bs[0]
    cls, sep = ld.vocab.id("cls"), ld.vocab.id("sep")
    assert (b["input_ids"][:, 0] == cls).all() and b["input_ids"].shape[1] <= 128
    for ids, segs in zip(b["input_ids"], b["token_type_ids"]):
        b_start = int(torch.nonzero(segs == 1)[0])
        assert ids[b_start - 1] == sep and ids[segs == 1][-1] == sep
    # On documents whose tokens count up, "consecutive" is visible: A ends where B starts, or swapped.
    from glm_dist.data.shards import Doc
    from glm_dist.objectives.sentence_pairs import PairBuilder

    docs = (Doc(str(i), np.arange(1000 * i + 10, 1000 * i + 400), np.arange(0, 390, 13)) for i in range(10**6))
    builder = PairBuilder(64, cls_id=2, sep_id=3, swap=True)
    for pair, _ in zip(builder.units(docs, lambda k: np.random.default_rng(k)), range(300)):
        t, segs = pair["tokens"], pair["token_type_ids"]
        a, b_ = t[1 : int((segs == 0).sum()) - 1], t[int((segs == 0).sum()) : -1]
        assert (a[-1] < b_[0]) == (pair["sentence_label"] == 0)
    labels = torch.cat([x["labels"] for x in bs]).numpy()
    originals = np.where(labels != IGNORE_INDEX, labels, torch.cat([x["input_ids"] for x in bs]).numpy())
    maskable = ~np.isin(originals, ld.vocab.specials)
    assert (labels != IGNORE_INDEX).sum() / maskable.sum() == pytest.approx(0.15, abs=0.005)  # with 3-grams


def test_nsp_takes_b_from_another_document_half_the_time(shards):
    ld, bs = batches(shards("bert"), "mlm_nsp", n_steps=100, seq_len=128)
    labels = torch.cat([b["sentence_label"] for b in bs]).float()  # 3200 pairs: std of the mean 0.009
    assert labels.mean().item() == pytest.approx(0.5, abs=0.04)
    lengths = torch.cat([(b["input_ids"] != ld.pad_id).sum(1) for b in bs]).float()
    assert (lengths < 64).float().mean().item() > 0.03  # the 10% shorter targets show up


# -- T5 -----------------------------------------------------------------------------------------------
def test_t5_span_corruption_lengths_spans_and_sentinels(shards):
    d = shards("t5")
    assert span_corruption.raw_length_for(512) == (568, 114) and span_corruption.raw_length_for(128) == (141, 29)
    ld, bs = batches(d, "span_corruption", n_steps=8, seq_len=512, micro=16)
    for b in bs:
        assert b["input_ids"].shape == (16, 512) and b["labels"].shape == (16, 114)
        assert "attention_mask" not in b  # exactly the configured length, no padding
    sentinels = ld.vocab.ids["sentinels"]
    assert sentinels[0] == ld.vocab.size - 1 and sentinels[1] == ld.vocab.size - 2
    lengths = []
    rng = np.random.default_rng(0)
    for _ in range(3000):
        mask = span_corruption.noise_mask(568, rng)
        runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]]))))[::2]
        lengths.extend(runs)
        assert mask.sum() == 85 and not mask[0]  # round(568 * 0.15); spans start after non-noise
    assert np.mean(lengths) == pytest.approx(3.0, abs=0.1)
    # inputs + targets reconstruct the raw text
    raw = np.arange(5, 573)
    inputs, targets = span_corruption.corrupt(raw, rng, sentinels=sentinels, eos_id=ld.vocab.id("eos"))
    rebuilt, t = [], list(targets[:-1])
    for tok in inputs[:-1]:
        if tok in sentinels:
            k = t.index(tok)
            nxt = next((i for i in range(k + 1, len(t)) if t[i] in sentinels), len(t))
            rebuilt.extend(t[k + 1 : nxt])
        else:
            rebuilt.append(tok)
    assert rebuilt == raw.tolist()
    assert bs[0]["decoder_input_ids"][0, 0] == ld.vocab.id("pad")
    assert torch.equal(bs[0]["decoder_input_ids"][:, 1:], bs[0]["labels"][:, :-1])


# -- BART ---------------------------------------------------------------------------------------------
def test_bart_infilling_masks_30_percent_in_poisson_3_spans():
    rng, cfg = np.random.default_rng(0), denoising.DenoisingOptions(permute_sentences=False)
    all_lengths, masked_frac = [], []
    tokens = np.arange(10, 1010)
    for _ in range(400):
        noised, lengths = denoising.infill(tokens, rng, mask_id=3, cfg=cfg, vocab_size=2000, special_ids=np.arange(5))
        all_lengths.extend(lengths[:-1])  # the last span is trimmed to the budget
        masked_frac.append(lengths.sum() / len(tokens))
        assert (noised == 3).sum() == len(lengths)  # one mask per span, zero-length spans insert one
        kept = noised[noised != 3]
        assert len(kept) == len(tokens) - lengths.sum() and np.all(np.diff(kept) > 0)  # order kept
    assert np.mean(masked_frac) == pytest.approx(0.3, abs=0.001)
    assert np.mean(all_lengths) == pytest.approx(3.0, abs=0.05)
    assert np.mean(np.asarray(all_lengths) == 0) == pytest.approx(np.exp(-3), abs=0.01)


def test_bart_permutes_sentences_and_reconstructs_the_original(shards):
    ld, bs = batches(shards("roberta"), "denoising", n_steps=4, seq_len=128, micro=8)
    b = bs[0]
    bos, eos, mask = ld.vocab.id("bos"), ld.vocab.id("eos"), ld.vocab.id("mask")
    assert (b["labels"][:, 0] == bos).all()
    real = b["labels"][:, 1:] != IGNORE_INDEX  # positions inside each sample
    assert torch.equal(b["decoder_input_ids"][:, 1:][real], b["labels"][:, :-1][real])
    assert (b["decoder_input_ids"][:, 0] == eos).all()
    frac = (b["input_ids"] == mask).sum().item() / (b["labels"] != -100).sum().item()
    assert 0.05 < frac < 0.2  # ~0.3 of tokens in spans of mean 3 -> ~0.1 masks per token
    tokens, starts = np.arange(100, 160), np.array([0, 10, 25, 40])
    perm = denoising.permute_sentences(tokens, starts, np.random.default_rng(4))
    assert sorted(perm.tolist()) == tokens.tolist() and perm.tolist() != tokens.tolist()


# -- ELECTRA, XLNet -----------------------------------------------------------------------------------
def test_electra_generator_masks_85_percent_keeps_15_and_discriminator_targets(shards):
    ld, bs = batches(shards("bert"), "electra", n_steps=30)
    inputs = torch.cat([b["input_ids"] for b in bs]).numpy()
    labels = torch.cat([b["labels"] for b in bs]).numpy()
    originals = np.where(labels != IGNORE_INDEX, labels, inputs)
    split = mlm_stats(inputs, labels, originals, ld.vocab.id("mask"))
    assert split["masked"] == pytest.approx(0.85, abs=0.01) and split["random"] == 0
    assert electra.rate_for("electra-large") == 0.25 and electra.rate_for("electra-base") == 0.15
    ids, lab = torch.tensor(inputs[:2]), torch.tensor(labels[:2])
    sampled = torch.where(lab != IGNORE_INDEX, torch.tensor(originals[:2]), ids)
    sampled[lab != IGNORE_INDEX] = (sampled[lab != IGNORE_INDEX] + 1) % ld.vocab.size  # all replaced
    replaced, targets = electra.discriminator_inputs(ids, lab, sampled)
    assert torch.equal(targets.bool(), lab != IGNORE_INDEX)


def test_xlnet_permutation_inputs_match_the_reference_collator_statistics(shards):
    from transformers import DataCollatorForPermutationLanguageModeling, PreTrainedTokenizerFast

    d = shards("xlnet")
    ld, bs = batches(d, "plm", n_steps=20, seq_len=128)
    labels = torch.cat([b["labels"] for b in bs])
    perm = torch.cat([b["perm_mask"] for b in bs])
    predicted = labels != IGNORE_INDEX
    tok = PreTrainedTokenizerFast(
        tokenizer_file=f"{d}/tokenizer.json",
        mask_token="<mask>",
        pad_token="<pad>",
        unk_token="<unk>",
        cls_token="<cls>",
        sep_token="<sep>",
    )
    torch.manual_seed(0)
    hf = DataCollatorForPermutationLanguageModeling(tok)(
        [{"input_ids": r} for r in torch.cat([b["input_ids"] for b in bs]).tolist()]
    )
    assert predicted.float().mean().item() == pytest.approx((hf["labels"] != -100).float().mean().item(), abs=0.01)
    assert predicted.float().mean().item() == pytest.approx(1 / 6, abs=0.02)
    diag = torch.diagonal(perm, dim1=1, dim2=2)
    assert torch.equal(diag.bool(), predicted)  # a predicted token never sees itself
    # perm_mask[i, j] = 1: i may not see j. Only targets are ever hidden (columns), as in the
    # reference collator -- a row-wise mask would let context tokens carry a target's own token to it.
    assert not perm.transpose(1, 2)[~predicted].any()
    assert not hf["perm_mask"].transpose(1, 2)[hf["labels"] == -100].any()
    assert perm[predicted.unsqueeze(1).expand_as(perm) & ~predicted.unsqueeze(2)].all()  # context never sees a target
    runs = []
    for row in predicted.int().numpy():
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row, [0]])))
        runs.extend(edges[1::2] - edges[::2])
    assert max(runs) <= 10 and np.mean(runs) <= 5
