"""ELMo: the word-level tokenizer and its characters, the recurrent building blocks, the biLM (published
count on the meta device, padding-invariance, each direction reads only its own side), the bilm
objective's windows, the scalar mix over a frozen biLM and feature export, pretraining on the embedded
corpus with glm eval, ZeRO-2 on two processes equal to one and exact resume, and the layouts and
recipes it refuses or plans."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import numpy as np
import pytest
import torch

from data_pipeline.tokenize.word import BOS_CHAR, BOW_CHAR, EOS_CHAR, EOW_CHAR, PAD_CHAR, char_table, word_chars
from glm_dist.data.loader import Loader, validation_batches
from glm_dist.data.shards import read_manifest
from glm_dist.families.elmo.model import ELMo, elmo_config
from glm_dist.models.recurrent import LockedDropout, WeightDrop, WordDropEmbedding, reverse_padded
from glm_dist.objectives.bilm import BILM
from glm_dist.transfer.elmo import ElmoEmbedder, ScalarMix, encode
from glm_dist.transfer.features import export_features
from tests.conftest import ROOT, train_losses
from tests.test_glove import glm as run_glm  # one thread per process

ELMO = str(ROOT / "configs/experiments/elmo-tiny-cpu.yaml")
QUICK = [
    "train.eval_interval=0",
    "train.eval_batches=4",
    "train.micro_batch_size=8",
    "data.seq_len=32",
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.precision=fp32",
    "train.warmup_steps=4",
    "model.vocab_size=3000",
    "train.save_interval=0",
]


def tiny(**kw) -> ELMo:
    torch.manual_seed(0)
    return ELMo(elmo_config("elmo-tiny", vocab_size=50, **kw)).eval()


# -- tokenizer and characters ------------------------------------------------------------------------
def test_words_are_spelled_as_elmo_reads_them():
    assert word_chars("dog").tolist()[:6] == [BOW_CHAR, ord("d") + 1, ord("o") + 1, ord("g") + 1, EOW_CHAR, PAD_CHAR]
    long = word_chars("x" * 80)
    assert len(long) == 50 and long[0] == BOW_CHAR and long[49] == EOW_CHAR and (long[1:49] == ord("x") + 1).all()
    assert word_chars("é").tolist()[1:3] == [0xC3 + 1, 0xA9 + 1]  # UTF-8 bytes
    table = char_table(["<pad>", "<unk>", "<bos>", "<eos>", "dog"], pad=0, bos=2, eos=3)
    assert (table[0] == 0).all() and table[2, :3].tolist() == [BOW_CHAR, BOS_CHAR, EOW_CHAR]
    assert table[3, :3].tolist() == [BOW_CHAR, EOS_CHAR, EOW_CHAR] and (table[4] == word_chars("dog")).all()


def test_word_profile_keeps_the_most_frequent_words(shards, corpus):
    import gzip

    from tokenizers import Tokenizer

    from data_pipeline.tokenize.prepare import ShardSpec, is_validation
    from data_pipeline.tokenize.word import split_words

    root = shards("word")
    manifest = read_manifest(root)
    t = manifest["tokenizer"]
    assert t["kind"] == "wordlevel" and t["vocab_size"] == 3000
    ids = t["special_ids"]
    assert (ids["pad"], ids["unk"], ids["bos"], ids["eos"]) == (0, 1, 2, 3) and len(ids["words"]) == 3000
    # the vocabulary is the 2,996 most frequent words of the training documents: no word left out
    # is more frequent than a word kept (ties at the cut may go either way)
    per_mille = ShardSpec.__dataclass_fields__["val_per_mille"].default
    counts: Counter = Counter()
    for line in gzip.open(corpus, "rt", encoding="utf-8"):
        record = json.loads(line)
        if not is_validation(record["id"], per_mille):  # the split hashes the record's own id
            counts.update(split_words(record["text"]))
    kept = set(ids["words"][4:])
    assert kept <= set(counts) and len(kept) == 2996
    assert min(counts[w] for w in kept) >= max(c for w, c in counts.items() if w not in kept)
    tok = Tokenizer.from_file(f"{root}/tokenizer.json")
    enc = tok.encode("Return the Value, qwzxv.")
    assert enc.tokens == ["return", "the", "value", ",", "<unk>", "."]
    assert [ids["words"][i] for i in enc.ids] == enc.tokens


# -- building blocks ---------------------------------------------------------------------------------
def test_recurrent_dropouts_drop_what_they_say():
    torch.manual_seed(0)
    locked = LockedDropout(0.5).train()
    y = locked(torch.ones(4, 7, 16))
    assert ((y == 0) == (y[:, :1] == 0)).all() and 0.2 < (y == 0).float().mean() < 0.8  # one mask per sequence
    embed = WordDropEmbedding(10, 8, p=0.5).train()
    out = embed(torch.tensor([[3, 3, 5, 5, 7, 7]]))
    zero = (out == 0).all(-1)[0]
    assert (zero[0::2] == zero[1::2]).all()  # a dropped word is dropped at every position
    assert set(embed.state_dict()) == {"weight"}
    lstm = torch.nn.LSTM(4, 6, batch_first=True)
    drop = WeightDrop(lstm, 0.5).train()
    x = torch.randn(2, 5, 4)
    drop(x)[0].sum().backward()
    assert (lstm.weight_hh_l0.grad == 0).float().mean() > 0.2 and (lstm.weight_ih_l0.grad != 0).all()
    assert [n for n, _ in drop.named_parameters()] == [f"lstm.{n}" for n, _ in lstm.named_parameters()]
    assert torch.equal(drop.eval()(x)[0], lstm(x)[0])
    lengths = torch.tensor([3, 5])
    assert reverse_padded(torch.arange(10).view(2, 5), lengths).tolist() == [[2, 1, 0, 3, 4], [9, 8, 7, 6, 5]]


# -- the biLM ------------------------------------------------------------------------------------------
def test_published_elmo_counts_93_6m_without_its_softmax():
    with torch.device("meta"):
        model = ELMo(elmo_config("elmo"))
    chars = sum(p.numel() for p in model.tokens.parameters())
    lstms = sum(p.numel() for lm in (model.forward_lm, model.backward_lm) for p in lm.parameters())
    n = model.num_params(softmax=False)
    print(
        f"ELMo: char CNN + highway + projection {chars:,}, four LSTMP layers {lstms:,}, total {n:,} "
        f"(softmax {model.num_params() - n:,} more)"
    )
    assert n == chars + lstms and abs(chars - 18.0e6) < 0.1e6 and abs(lstms - 75.6e6) < 0.1e6
    assert abs(n - 93.6e6) / 93.6e6 < 0.01


@pytest.mark.parametrize("char_cnn", [True, False])
def test_padding_never_changes_a_sequences_outputs(char_cnn):
    model = tiny(char_cnn=char_cnn, dropout=0.3)
    rng = np.random.default_rng(0)
    lengths = [7, 3, 5]
    seqs = [torch.from_numpy(rng.integers(4, 50, size=n)) for n in lengths]
    table = torch.from_numpy(char_table([f"w{i}" for i in range(50)], pad=0, bos=2, eos=3).astype(np.int64))
    ids = torch.zeros(3, 7, dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = s
    mask = (torch.arange(7)[None] < torch.tensor(lengths)[:, None]).long()
    with torch.no_grad():
        batch = model(ids, char_ids=table[ids], attention_mask=mask, layers=True)
        for b, s in enumerate(seqs):
            alone = model(s[None], char_ids=table[s[None]], layers=True)
            for key in ("forward_logits", "backward_logits"):
                assert torch.allclose(batch[key][b, : len(s)], alone[key][0], atol=1e-5), (key, b)
            assert torch.allclose(batch["layers"][:, b, : len(s)], alone["layers"][:, 0], atol=1e-5)


def test_each_direction_reads_only_its_own_side():
    model = tiny(char_cnn=False)
    ids = torch.randint(4, 50, (1, 9))
    changed = ids.clone()
    changed[0, 4] = (ids[0, 4] + 1 - 4) % 46 + 4
    with torch.no_grad():
        a, b = model(ids), model(changed)
    fwd = (a["forward_logits"] - b["forward_logits"]).abs().amax(-1)[0]
    bwd = (a["backward_logits"] - b["backward_logits"]).abs().amax(-1)[0]
    assert (fwd[:4] == 0).all() and (fwd[4:] > 0).all()  # the forward LM at t has read tokens <= t
    assert (bwd[5:] == 0).all() and (bwd[:5] > 0).all()  # the backward LM at t has read tokens >= t


def test_bilm_windows_give_every_input_its_next_and_previous_token(shards):
    loader = Loader(shards("word"), objective="bilm", seq_len=16, micro_batch_size=4)
    first = loader.next_step()[0]
    ids = first["input_ids"]
    assert ids.shape == (4, 16) and first["char_ids"].shape == (4, 16, 50)
    assert torch.equal(first["forward_labels"][:, :-1], ids[:, 1:]) and torch.equal(
        first["backward_labels"][:, 1:], ids[:, :-1]
    )
    words = read_manifest(shards("word"))["tokenizer"]["special_ids"]
    table = torch.from_numpy(char_table(words["words"], pad=0, bos=2, eos=3).astype(np.int64))
    assert torch.equal(first["char_ids"], table[ids])


def test_bilm_marks_documents_and_packs_them_into_windows():
    from glm_dist.data.shards import Doc
    from glm_dist.objectives.base import Vocab

    vocab = Vocab(size=20, ids={"bos": 2, "eos": 3, "pad": 0, "all_specials": [0, 1, 2, 3]})
    docs = iter([Doc(str(i), np.arange(10 + 3 * i, 13 + 3 * i), np.zeros(1)) for i in range(3)])
    builder = BILM.builder(seq_len=4, vocab=vocab, opts=None)
    # stream: <bos> 10 11 12 <eos> <bos> 13 14 15 <eos> <bos> 16 17 18 <eos>
    windows = [w.tolist() for w in itertools.islice(builder.units(docs), 3)]
    assert windows == [[2, 10, 11, 12, 3, 2], [3, 2, 13, 14, 15, 3], [15, 3, 2, 16, 17, 18]]
    sample = BILM.sample(np.array(windows[0]), None, vocab=vocab, opts=None)
    assert sample["input_ids"].tolist() == [10, 11, 12, 3] and "char_ids" not in sample  # no word list: no characters
    assert sample["forward_labels"].tolist() == [11, 12, 3, 2] and sample["backward_labels"].tolist() == [2, 10, 11, 12]


# -- transfer ------------------------------------------------------------------------------------------
def test_scalar_mix_over_a_frozen_bilm():
    model = tiny(dropout=0.5)
    embedder = ElmoEmbedder(model, num_mixes=2, layer_norm=False).train()
    layers = torch.randn(3, 2, 4, 8)
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.weights.copy_(torch.tensor([0.0, 1.0, 2.0]))
        mix.gamma.fill_(0.5)
    s = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
    assert torch.allclose(mix(layers), 0.5 * (s[:, None, None, None] * layers).sum(0), atol=1e-6)
    normed = ScalarMix(3, layer_norm=True)(layers * 100 + 7)
    assert torch.allclose(normed.mean(), torch.tensor(0.0), atol=1e-4)
    ids = torch.randint(4, 50, (2, 6))
    chars = torch.from_numpy(char_table([f"w{i}" for i in range(50)], pad=0, bos=2, eos=3).astype(np.int64))[ids]
    out = embedder(ids, char_ids=chars)
    assert len(out) == 2 and out[0].shape == (2, 6, 2 * model.cfg.d_model)
    assert torch.equal(out[0], embedder(ids, char_ids=chars)[0])  # frozen biLM in eval mode: no dropout
    sum(o.sum() for o in out).backward()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is not None for p in embedder.mixes.parameters())


# -- training ------------------------------------------------------------------------------------------
def args(shards_dir: str, out, *extra: str) -> list[str]:
    return ["train", "-c", ELMO, *QUICK, f"data.shards_dir={shards_dir}", f"train.out_dir={out}", *extra]


def summary(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def unigram_entropy(shards_dir: str) -> float:
    """Cross-entropy (nats) of the validation targets under the training tokens' unigram distribution."""
    train = Counter()
    loader = Loader(shards_dir, objective="bilm", seq_len=32, micro_batch_size=64)
    for _ in range(20):
        train.update(loader.next_step()[0]["forward_labels"].flatten().tolist())
    val = Counter()
    for batch, _ in validation_batches(shards_dir, seq_len=32, micro_batch_size=8, num_batches=8, objective="bilm"):
        val.update(batch["forward_labels"].flatten().tolist())
    n, m = sum(train.values()), sum(val.values())
    return -sum(c / m * math.log(max(train[t], 1) / n) for t, c in val.items())


@pytest.mark.slow
def test_tiny_elmo_pretrains_below_the_unigram_baseline_evaluates_and_exports_features(shards, tmp_path):
    root, out = shards("word"), tmp_path / "run"
    # word embeddings as the token layer: the character CNN learns the words' identities first, which
    # takes more than a test's few hundred steps (elmo-tiny trains in the ZeRO-2 test below)
    proc = run_glm(
        args(
            root,
            out,
            "model.flavor=elmo-tiny-words",
            "train.max_steps=300",
            "train.lr=1e-2",
            "train.warmup_steps=10",
            "train.eval_batches=8",
        )
    )
    s = summary(proc)
    entropy = unigram_entropy(root)
    print(
        f"ELMo tiny (word embeddings) after 300 steps: forward / backward / mean perplexity "
        f"{s['val_forward_perplexity']:.1f} / "
        f"{s['val_backward_perplexity']:.1f} / {s['val_perplexity']:.1f}; unigram {math.exp(entropy):.1f}"
    )
    assert s["val_forward_loss"] < entropy - 0.3 and s["val_backward_loss"] < entropy - 0.3, (s, entropy)
    ckpt = out / "checkpoints/step_00000300"
    ev = run_glm(
        ["eval", "-c", ELMO, *QUICK, "train.eval_batches=8", f"data.shards_dir={root}", "--checkpoint", str(ckpt)]
    )
    metrics = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert metrics["loss"] == pytest.approx(s["val_loss"], abs=1e-4)
    assert metrics["perplexity"] == pytest.approx((metrics["forward_perplexity"] + metrics["backward_perplexity"]) / 2)
    texts = ["Return the value of qwzxvy.", "Open a file"]
    features = export_features(ckpt, texts, out=tmp_path / "features.npz")
    assert [f.shape for f in features] == [(3, 6, 128), (3, 3, 128)]  # (L + 1, words, 2 d_model)
    from tokenizers import Tokenizer

    batch, words = encode(Tokenizer.from_file(str(ckpt / "tokenizer.json")), texts)
    assert words[0][4] == "qwzxvy" and batch["input_ids"][0, 5] == 1  # an unknown word keeps its characters
    assert np.allclose(np.load(tmp_path / "features.npz")["1"], features[1])
    assert not np.allclose(features[0][0, 0], features[1][0, 0])  # token layer: "return" vs "open"


@pytest.mark.slow
def test_zero2_on_two_ranks_matches_one_process_and_resumes_exactly_on_another_layout(shards, tmp_path):
    root = shards("word")
    run = [
        "train.max_steps=6",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "train.optimizer=adagrad",
        "train.lr=0.5",
        "train.adagrad_initial_accumulator=1.0",
        "train.schedule=constant",
        "train.warmup_steps=0",
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
    assert reference[-1] < reference[0] - 0.3  # AdaGrad as bilm-tf (accumulator from 1.0) trains it


@pytest.mark.parametrize("layout", ["parallel.pipeline_stages=2", "parallel.tensor_parallel=2"])
def test_layouts_elmo_does_not_split_are_refused(layout):
    proc = run_glm(["config", "show", "-c", ELMO, "--world-size", "2", layout], check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    if "pipeline" in layout:
        assert "not elmo (bilm)" in proc.stderr, proc.stderr


def test_published_elmo_recipe_validates_and_plans():
    recipe = str(ROOT / "configs/experiments/published/elmo.yaml")
    planned = json.loads(run_glm(["plan", "-c", recipe, "--gpus", "3", "--json"]).stdout)
    assert planned["recommended"] is not None
    assert {(lay["pp"], lay["tp"]) for lay in planned["layouts"]} == {(1, 1)}
    shown = run_glm(["config", "show", "-c", recipe, "--world-size", "3"]).stdout
    assert "family: elmo" in shown and "optimizer: adagrad" in shown and "seq_len: 20" in shown
