"""ELMo downstream: WordNet's example sentences as words in context (counts, Morphy's matching on real
entries, splits disjoint by lemma), the task model over a frozen biLM (no gradient reaches the biLM,
the scalar mixes learn, precomputed layers give the same logits), ``glm features`` on a trained
checkpoint, and a linear probe of real biLM vectors beating the majority class on part of speech."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from data_pipeline.tasks.wordnet_context import items, split
from data_pipeline.wordnet import Morphy
from glm_dist.errors import GlmError
from glm_dist.families.elmo.model import ELMo, elmo_config
from glm_dist.transfer.elmo import ElmoEmbedder, encode, layer_features
from glm_dist.transfer.elmo_task import WordInContext, accuracy, collate, fit, task_vocabulary
from glm_dist.transfer.features import read_texts
from glm_dist.transfer.probe import ProbeSplit, linear_probe, majority_accuracy
from tests.test_elmo import ELMO, QUICK
from tests.test_glove import glm as run_glm

POS = ("n", "v", "a", "r")


@pytest.fixture(scope="module")
def wordnet_items():
    return items()


@pytest.fixture(autouse=True)
def one_thread():
    """Small recurrent kernels: a second thread's synchronisation costs more than it gives on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_morphy_finds_base_forms_as_wordnet_does():
    morphy = Morphy()
    assert morphy.base_forms("ran", "v")["run"] == "exception"  # verb.exc
    assert morphy.base_forms("mice", "n")["mouse"] == "exception"
    assert morphy.base_forms("happier", "s")["happy"] == "exception"  # satellites read adj.exc
    assert morphy.base_forms("carried", "v")["carry"] == "exception"  # no ied -> y rule: verb.exc lists it
    assert morphy.base_forms("boxes", "n")["box"] == "rule"  # xes -> x
    assert morphy.base_forms("firemen", "n")["fireman"] == "rule" and morphy.base_forms("taking", "v")["take"] == "rule"
    assert "glas" not in morphy.base_forms("glass", "n")  # a noun ending in ss keeps its s
    assert morphy.base_forms("quickly", "r") == {"quickly": "exact"}  # adverbs: exceptions only


def test_wordnet_sentences_locate_their_lemma_and_count_the_rest(wordnet_items):
    rows, counts = wordnet_items
    c = counts.as_dict()
    print("WordNet example sentences:", c)
    assert c["sentences"] == 48_339  # WordNet 3.0's quoted examples
    assert (
        sum(c["found"].values()) + c["not_found"] + c["multiword_only"]
        == c["sentences"]
        == c["items"] + c["not_found"] + c["multiword_only"]
    )
    assert len(rows) == c["items"] and c["found"]["exception"] > 500 and c["found"]["rule"] > 3000
    assert c["not_found"] < 0.05 * c["sentences"]
    by_id, morphy = {r["id"]: r for r in rows}, Morphy()
    for r in rows[::97]:
        assert r["lemma"] in morphy.base_forms(r["words"][r["position"]], r["pos"])
    ran = [r for r in rows if r["words"][r["position"]] == "ran" and r["lemma"] == "run"]
    assert ran and all(r["pos"] == "v" and r["supersense"].startswith("verb.") for r in ran)
    assert Counter(r["pos"] for r in rows).keys() == set(POS) and len({r["supersense"] for r in rows}) == 45
    assert len(by_id) == len(rows)


def test_splits_are_disjoint_by_lemma_and_by_synset(wordnet_items):
    rows, _ = wordnet_items
    for by in ("lemma", "synset"):
        parts = split(rows, seed=1, by=by)
        keys = {name: {r[by] for r in part} for name, part in parts.items()}
        assert not (keys["train"] & keys["test"] or keys["train"] & keys["valid"] or keys["valid"] & keys["test"])
        assert sum(len(p) for p in parts.values()) == len(rows) and 0.07 < len(parts["test"]) / len(rows) < 0.13
    assert {r["id"] for r in split(rows, seed=1)["test"]} != {r["id"] for r in split(rows, seed=2)["test"]}


def tiny_bilm() -> ELMo:
    torch.manual_seed(0)
    return ELMo(elmo_config("elmo-tiny", vocab_size=3000)).eval()


def test_task_model_trains_the_mixes_and_never_the_frozen_bilm(wordnet_items, shards):
    rows, _ = wordnet_items
    tok = Tokenizer.from_file(f"{shards('word')}/tokenizer.json")
    bilm = tiny_bilm()
    before = {k: v.clone() for k, v in bilm.state_dict().items()}
    embedder = ElmoEmbedder(bilm, num_mixes=2)
    sample = [dict(r, label=POS.index(r["pos"])) for r in rows[::400]][:64]
    vocab = task_vocabulary(sample)
    model = WordInContext(vocab_size=len(vocab) + 2, num_classes=4, elmo=embedder, elmo_output=True, dropout=0.0)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    batch = collate(sample, vocab, with_layers=False)
    bilm_inputs, _ = encode(tok, [r["words"] for r in sample])
    for _ in range(3):
        logits = model(batch["ids"], batch["mask"], batch["position"], bilm_inputs=bilm_inputs)
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None for p in bilm.parameters())
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in bilm.state_dict().items())
    assert not bilm.training and all(m.weights.abs().sum() > 0 for m in embedder.mixes)  # w moved from 0
    assert all(abs(m.gamma.item() - 1.0) > 1e-4 for m in embedder.mixes)
    # precomputed layers (what a learning curve caches) give the same logits as running the biLM
    for r, f in zip(sample, layer_features(bilm, tok, [r["words"] for r in sample])):
        r["layers"] = f
    model.eval()
    with torch.no_grad():
        live = model(batch["ids"], batch["mask"], batch["position"], bilm_inputs=bilm_inputs)
        cached = collate(sample, vocab, with_layers=True)
        assert torch.allclose(
            live, model(cached["ids"], cached["mask"], cached["position"], layers=cached["layers"]), atol=1e-5
        )
    info = fit(model, sample, sample, vocab, seed=0, min_steps=1, min_epochs=3)
    assert info["epochs"] == 3 and accuracy(model, sample, vocab) == info["valid_accuracy"]  # the best weights kept


def test_a_linear_probe_of_bilm_vectors_beats_the_majority_part_of_speech(wordnet_items, shards):
    """Random biLM weights: LSTM 1's vectors of unseen lemmas still carry their context ("the ___ of")."""
    rows, _ = wordnet_items
    tok = Tokenizer.from_file(f"{shards('word')}/tokenizer.json")
    sample = [dict(r) for r in rows[::30]]
    feats = layer_features(tiny_bilm(), tok, [r["words"] for r in sample], batch_size=128)
    for r, f in zip(sample, feats):
        r["vector"] = f[1, r["position"]]
    parts = split(sample, seed=0, by="lemma")
    data = {
        k: ProbeSplit(np.stack([r["vector"] for r in v]), np.array([POS.index(r["pos"]) for r in v]))
        for k, v in parts.items()
    }
    result = linear_probe(data["train"], data["valid"], data["test"], num_classes=4, seed=0, epochs=8)
    majority = majority_accuracy(data["train"], data["test"])
    print(
        f"POS probe of LSTM 1 on {len(parts['test'])} held-out-lemma items: {result['test_accuracy']:.3f} "
        f"(majority {majority:.3f})"
    )
    assert result["test_accuracy"] > majority + 0.1


def test_glm_features_writes_a_checkpoints_layers(shards, tmp_path):
    root, out = shards("word"), tmp_path / "run"
    run_glm(
        [
            "train",
            "-c",
            ELMO,
            *QUICK,
            f"data.shards_dir={root}",
            f"train.out_dir={out}",
            "train.max_steps=2",
            "train.save_interval=2",
            "train.warmup_steps=1",
        ]
    )
    ckpt = out / "checkpoints/step_00000002"
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"sentence": s}) + "\n" for s in ["He ran the dishwasher.", "Open a file"]))
    proc = run_glm(
        [
            "features",
            "--checkpoint",
            str(ckpt),
            "--input",
            str(texts),
            "--text-field",
            "sentence",
            "--out",
            str(tmp_path / "f.npz"),
        ]
    )
    assert json.loads(proc.stdout) == {"out": str(tmp_path / "f.npz"), "texts": 2, "first_shape": [3, 5, 128]}
    saved = np.load(tmp_path / "f.npz")
    assert saved["1"].shape == (3, 3, 128) and np.isfinite(saved["0"]).all()
    with pytest.raises(GlmError, match="row 1 has no text field 'text'"):
        read_texts(str(texts))
    lines = tmp_path / "texts.txt"
    lines.write_text("He ran the dishwasher.\n\nOpen a file\n")
    assert read_texts(str(lines)) == ["He ran the dishwasher.", "Open a file"]
