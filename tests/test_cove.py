"""CoVe: gettext catalogs as translation pairs (held out by message id, what is dropped counted), the pair
set whose source vocabulary and frozen inputs are GloVe's, the translation objective's samples and exact
resume, the model (the released MT-LSTM's 3.61M on the meta device, padding never changes a pair's
outputs, incremental decoding equal to teacher forcing), training on two ZeRO-2 ranks equal to one
process with exact resume on another layout, glm eval's perplexity and BLEU, feature export, the
downstream classifier on WordNet glosses, and the layouts and recipes it refuses or plans."""

from __future__ import annotations

import json
import os
from collections import Counter

import numpy as np
import pytest
import torch

from data_pipeline.cooccur.vectors import read_text
from data_pipeline.readers.gettext import catalog_paths
from data_pipeline.tokenize.pairs import PAIR_TOKEN, TARGET, PairSpec, prepare_pairs
from data_pipeline.translation_pairs import write_pairs
from glm_dist.cli import main
from glm_dist.config.checks import validate
from glm_dist.config.loader import ConfigError, load_config
from glm_dist.data.loader import Loader
from glm_dist.data.shards import read_manifest, read_shard
from glm_dist.models.generate import GenerationConfig, generate
from glm_dist.families.cove.model import CoVe, cove_config, load_inputs
from tests.conftest import ROOT, train_losses
from tests.test_glove import glm as run_glm  # one thread per process

COVE = str(ROOT / "configs/experiments/cove-tiny-cpu.yaml")
# Catalogs of essential packages and iso-codes (iso_639.mo is Debian's link to iso_639-2.mo), which
# share messages ("invalid option" and the like): ~4.4k pairs.
CATALOGS = ("coreutils", "tar", "findutils", "diffutils", "grep", "sed", "bash", "iso_639-2", "iso_639", "iso_3166-1")
GERMAN = [p for p in catalog_paths("de") if os.path.basename(p)[:-3] in CATALOGS]
pytestmark = pytest.mark.skipif(
    len(GERMAN) < 8,
    reason="the German catalogs of coreutils, tar, ... and iso-codes "
    "are not in /usr/share/locale/de (launch/setup_env.sh)",
)
QUICK = [
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.eval_interval=0",
    "train.save_interval=0",
    "train.warmup_steps=0",
    "train.schedule=constant",
    "train.eval_batches=2",
    "train.micro_batch_size=8",
    "data.seq_len=16",
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> tuple[str, dict]:
    out = tmp_path_factory.mktemp("pairs")
    return str(out), write_pairs(GERMAN, out, val_per_mille=100)


@pytest.fixture(scope="module")
def pair_set(pairs, glove_text, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("pair-set"))
    prepare_pairs(
        PairSpec(
            source=pairs[0],
            out_dir=out,
            vectors=glove_text,
            vocab_size=3000,
            target_vocab_size=4096,
            shard_max_bytes=64 * 1024,
        )
    )
    return out


def rows(path) -> list[dict]:
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_gettext_pairs_are_held_out_by_message_and_count_what_they_drop(pairs):
    folder, stats = pairs
    train, valid = rows(f"{folder}/train.jsonl"), rows(f"{folder}/validation.jsonl")
    assert stats["catalogs"] == len(GERMAN) - 1  # the linked catalog is read once
    assert stats["pairs"] == {"train": len(train), "validation": len(valid)} and len(train) > 3000
    assert 0.05 < len(valid) / (len(train) + len(valid)) < 0.15  # val_per_mille=100
    assert not {r["source"] for r in train} & {r["source"] for r in valid}  # a message is on one side only
    assert stats["skipped"]["duplicate"] > 50  # "invalid option" and friends, once each
    every = [(r["source"], r["target"]) for r in train + valid]
    assert len(every) == len(set(every)) and all(s.strip() and t.strip() for s, t in every)
    assert Counter(r["plural"] for r in train)["other"] >= 10  # plural entries give their plural form too
    assert stats["with_placeholders"] > 100
    assert set(stats["skipped"]) <= {"duplicate", "untranslated", "fuzzy", "placeholder mismatch", "blank"}


def test_pair_set_reads_glove_words_as_its_source_vocabulary(pair_set, glove_text):
    manifest = read_manifest(pair_set)
    words, vectors = read_text(glove_text)
    src = manifest["tokenizer"]["special_ids"]["words"]
    assert src[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"] and src[4:] == words[: len(src) - 4]
    table = np.load(f"{pair_set}/source_vectors.npy")
    assert (table[:4] == 0).all() and np.array_equal(table[4:], vectors[: len(src) - 4])
    assert manifest["target_tokenizer"]["special_ids"]["all_specials"] == [0, 1, 2, 3]
    assert 0 < manifest["source"]["source_unknown_rate"] < 0.5
    tgt = manifest["target_tokenizer"]["special_ids"]["words"]
    refs = rows(f"{pair_set}/validation-pairs.jsonl")
    docs = [d for s in manifest["splits"]["validation"] for d in read_shard(f"{pair_set}/{s['name']}")]
    assert len(docs) == len(refs) > 100 and docs[0].tokens.dtype == PAIR_TOKEN
    first = docs[0].tokens
    side = first["side"] == TARGET
    assert side.any() and (~side).any() and not side[: int((~side).sum())].any()  # the source, then the target
    german = refs[0]["target"].lower()
    assert all(tgt[t] in german for t in first["token"][side] if t > 3)


def test_translation_samples_shift_the_target_and_resume_exactly(pair_set, shards):
    loader = Loader(pair_set, objective="translation", seq_len=12, micro_batch_size=4, seed=1)
    batch = loader.next_step()[0]
    labels, dec = batch["labels"], batch["decoder_input_ids"]
    assert (dec[:, 0] == 2).all() and batch["input_ids"].shape[1] <= 12 and labels.shape[1] <= 12
    words = (labels[:, :-1] != -100) & (labels[:, :-1] != 3)  # target words, not <eos>
    assert torch.equal(dec[:, 1:][words], labels[:, :-1][words])  # <bos> y1 y2 ... predicts y1 y2 ... <eos>
    assert ((labels == 3).sum(1) <= 1).all() and "attention_mask" in batch
    state = json.loads(json.dumps(loader.state_dict()))
    ahead = [loader.next_step()[0] for _ in range(3)]
    again = Loader(pair_set, objective="translation", seq_len=12, micro_batch_size=4, seed=1)
    again.load_state_dict(state)
    for want in ahead:
        got = again.next_step()[0]
        assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="not a translation pair set"):
        Loader(shards("word"), objective="translation", seq_len=12, micro_batch_size=2).next_step()


def tiny(pair_set: str | None = None) -> CoVe:
    torch.manual_seed(0)
    model = CoVe(cove_config("cove-tiny", vocab_size=3000, dropout=0.0)).eval()
    if pair_set:
        load_inputs(model, read_manifest(pair_set), pair_set)
    return model


def test_published_cove_counts_the_released_mt_lstm():
    with torch.device("meta"):
        model = CoVe(cove_config("cove"))
    # two bidirectional nn.LSTM layers, 300 -> 300 and 600 -> 300, each with two bias vectors per gate set
    layer1, layer2 = 2 * (4 * 300 * (300 + 300) + 8 * 300), 2 * (4 * 300 * (600 + 300) + 8 * 300)
    assert model.num_params(encoder_only=True) == layer1 + layer2 == 3_609_600
    assert model.glove.shape == (2_196_021, 300) and "glove" not in dict(model.named_parameters())


def test_padding_never_changes_a_pairs_outputs(pair_set):
    model = tiny(pair_set)
    torch.manual_seed(1)
    ids = torch.randint(4, 3000, (3, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    dec = torch.randint(4, 4000, (3, 5))
    logits = model(ids, dec, attention_mask=mask)["logits"]
    states = model.encoder_states(ids, mask)
    for b in range(3):
        n = int(mask[b].sum())
        alone = model(ids[b : b + 1, :n], dec[b : b + 1])["logits"]
        assert torch.allclose(alone, logits[b : b + 1], atol=1e-5)
        alone_states = model.encoder_states(ids[b : b + 1, :n])
        assert all(torch.allclose(a[0], s[b, :n], atol=1e-5) for a, s in zip(alone_states, states))
    assert states[0].abs().sum() > 0  # the GloVe table was filled


def test_incremental_decoding_is_teacher_forcing(pair_set):
    model = tiny(pair_set)
    ids, mask = torch.randint(4, 3000, (2, 6)), torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    greedy = generate(model, ids, GenerationConfig(max_new_tokens=7), attention_mask=mask, start_id=2)
    forced = model(ids, greedy[:, :-1], attention_mask=mask)["logits"].argmax(-1)
    assert greedy.shape == (2, 8) and torch.equal(forced, greedy[:, 1:])
    beam = generate(
        model,
        ids,
        GenerationConfig(max_new_tokens=7, strategy="beam", num_beams=3, eos_id=3),
        attention_mask=mask,
        start_id=2,
    )
    assert (beam[:, 0] == 2).all() and beam.shape[1] <= 9


@pytest.mark.slow
def test_zero2_on_two_ranks_matches_one_process_resumes_exactly_and_evaluates(pair_set, tmp_path):
    run = [
        *QUICK,
        f"data.shards_dir={pair_set}",
        "model.vocab_size=3000",
        "train.max_steps=6",
        "train.lr=3e-3",
        "train.global_batch_size=16",
        "model.dropout=0.0",
    ]
    one, split = tmp_path / "one", tmp_path / "split"
    run_glm(["train", "-c", COVE, *run, f"train.out_dir={one}", "train.grad_accum_steps=2", "parallel.zero_stage=0"])
    run_glm(
        [
            "train",
            "-c",
            COVE,
            *run,
            f"train.out_dir={split}",
            "parallel.zero_stage=2",
            "train.stop_at_step=3",
            "train.save_interval=3",
        ],
        nproc=2,
    )
    run_glm(["train", "-c", COVE, *run, f"train.out_dir={split}", "parallel.zero_stage=2", "train.grad_accum_steps=2"])
    reference, resumed = train_losses(one), train_losses(split)
    print(
        "one process:",
        [round(x, 5) for x in reference],
        "\ntwo ranks, ZeRO-2, resumed at 3 on one:",
        [round(x, 5) for x in resumed],
    )
    assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(reference, resumed)) < 1e-4, (reference, resumed)
    assert reference[-1] < reference[0] - 0.5
    ckpt = one / "checkpoints/step_00000006"
    ev = run_glm(["eval", "-c", COVE, *run, "--checkpoint", str(ckpt)])
    metrics = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert metrics["perplexity"] < 4096 and metrics["bleu_pairs"] == 16 and 0 <= metrics["bleu_beam"] <= 100
    assert metrics["examples"][0]["reference"] == rows(f"{pair_set}/validation-pairs.jsonl")[0]["target"]
    out = tmp_path / "features.npz"
    texts = tmp_path / "texts.txt"
    texts.write_text("Remove the file\nprint the version and exit\n")
    made = json.loads(run_glm(["features", "--checkpoint", str(ckpt), "--input", str(texts), "--out", str(out)]).stdout)
    assert made["texts"] == 2 and made["first_shape"] == [3, 50 + 128]  # [GloVe; CoVe] per word
    glove = np.load(out)["0"][:, :50]
    table = np.load(f"{pair_set}/source_vectors.npy")
    assert any(np.allclose(glove[0], row) for row in table)  # GloVe(w) is the pair set's own vector


def test_a_maxpool_classifier_over_glove_beats_the_majority_class_on_wordnet_glosses(pair_set):
    from tokenizers import Tokenizer

    from data_pipeline.tasks.wordnet_gloss import gloss_rows, majority_accuracy, sample
    from glm_dist.transfer.cove import CoVeEmbedder, fit_classifier

    splits = gloss_rows()
    train, valid, test = sample(splits["train"], 2000), sample(splits["valid"], 400), sample(splits["test"], 500)
    labels = sorted({r["label"] for r in splits["train"]})
    tok = Tokenizer.from_file(f"{pair_set}/tokenizer.json")
    result = fit_classifier(
        CoVeEmbedder(tiny(pair_set), glove_only=True),
        tok,
        train,
        valid,
        test,
        labels=labels,
        epochs=3,
        d_hidden=32,
        max_len=16,
        lr=3e-3,
    )
    baseline = majority_accuracy(train, test)
    print(
        f"WordNet gloss -> lexicographer file, 2000 training rows, GloVe only: {result['test_accuracy']:.3f} "
        f"(majority {baseline:.3f})"
    )
    assert len(labels) == 45 and result["test_accuracy"] > baseline + 0.03, (result, baseline)


@pytest.mark.parametrize("layout", ["parallel.pipeline_stages=2", "parallel.tensor_parallel=2"])
def test_layouts_cove_does_not_split_are_refused(layout):
    with pytest.raises(ConfigError, match="not cove"):
        validate(load_config(COVE, [layout]), world_size=2)


def test_published_cove_recipe_validates_and_plans(capsys):
    recipe = str(ROOT / "configs/experiments/published/cove.yaml")
    assert main(["plan", "-c", recipe, "--gpus", "8", "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["recommended"] is not None and {(lay["pp"], lay["tp"]) for lay in planned["layouts"]} == {(1, 1)}
    cfg = load_config(recipe)
    validate(cfg, world_size=8)
    assert (cfg.model.family, cfg.objective.name, cfg.data.vocab_size) == ("cove", "translation", 2_196_021)


# -- Cross-View Training for translation on the CoVe model (Clark et al. 2018, section 3.3) --

CVT_MT = str(ROOT / "configs/experiments/cvt-translation-tiny-cpu.yaml")


@pytest.fixture(scope="module")
def semi_set(pairs, glove_text, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("semi-set"))
    prepare_pairs(
        PairSpec(
            source=pairs[0],
            out_dir=out,
            vectors=glove_text,
            vocab_size=3000,
            target_vocab_size=4096,
            shard_max_bytes=64 * 1024,
            labelled_pairs=300,
        )
    )
    return out


def documents(shards_dir: str, split: str) -> list[tuple[str, np.ndarray]]:
    manifest = read_manifest(shards_dir)
    return [
        (doc.key, doc.tokens)
        for info in manifest["splits"][split]
        for doc in read_shard(f"{shards_dir}/{info['name']}")
    ]


def test_a_semi_supervised_pair_set_keeps_the_targets_of_the_labelled_pairs_only(pair_set, semi_set):
    labelled, unlabelled = documents(semi_set, "train"), documents(semi_set, "unlabelled")
    full = {pid: tokens for pid, tokens in documents(pair_set, "train")}
    assert len(labelled) == 300 and len(labelled) + len(unlabelled) == len(full)
    assert all((tokens["side"] == 0).all() for _, tokens in unlabelled)  # sources alone
    for pid, tokens in labelled:  # the same pairs (the target vocabulary is the labelled targets' alone)
        assert np.array_equal(tokens["side"], full[pid]["side"])
    for pid, tokens in unlabelled:  # the same sources: GloVe's vocabulary on both
        assert np.array_equal(tokens["token"], full[pid]["token"][full[pid]["side"] == 0])
    # keys are the id's SHA-1 in hex: the 300 smallest are the labelled pairs
    assert max(key for key, _ in labelled) < min(key for key, _ in unlabelled)
    semi, whole = read_manifest(semi_set), read_manifest(pair_set)
    assert len(documents(semi_set, "validation")) == len(documents(pair_set, "validation"))
    assert semi["target_tokenizer"]["vocab_size"] < whole["target_tokenizer"]["vocab_size"]
    assert semi["source"]["labelled_pairs"] == 300 and semi["source"]["unlabelled_sources"] == len(unlabelled)


def test_the_auxiliary_decoders_learn_the_primarys_beam_output_and_never_update_it(semi_set):
    from glm_dist.objectives.cvt_translation import CVT_TRANSLATION, teacher_targets

    torch.manual_seed(0)
    model = CoVe(cove_config("cove-tiny", vocab_size=3000, cvt_decoders=True, cvt_beam=3))
    load_inputs(model, read_manifest(semi_set), semi_set)
    loader = Loader(semi_set, objective="cvt_translation", split="unlabelled", seq_len=12, micro_batch_size=6, seed=1)
    batch = loader.next_step()[0]
    assert set(batch) == {"input_ids", "attention_mask"}  # an unlabelled minibatch: sources
    loss, _ = CVT_TRANSLATION.loss(model.train(), batch, metrics=False)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    primary = [n for n in grads if n.startswith(("decoder.query", "decoder.combine", "out."))]
    assert len(primary) == 6 and all(grads[n] is None for n in primary)  # the teacher is not trained
    shared = [n for n in grads if n.startswith(("auxiliary.", "decoder.blocks", "target_embed", "encoder.1"))]
    assert all(grads[n] is not None and grads[n].abs().sum() > 0 for n in shared), shared
    # the targets: the beam translation of the model without dropout, cut after its first <eos>
    model.zero_grad()
    seq = generate(
        model.eval(),
        batch["input_ids"],
        GenerationConfig(max_new_tokens=12, strategy="beam", num_beams=3, eos_id=3),
        attention_mask=batch["attention_mask"],
        start_id=2,
    )
    inputs, labels = teacher_targets(seq, eos=3)
    views = model(batch["input_ids"], inputs, attention_mask=batch["attention_mask"], mode="student")["auxiliary"]
    real = labels != -100
    assert ((labels == 3).sum(1) <= 1).all() and torch.equal(real.sum(1), real.cumprod(1).sum(1))  # a prefix per row
    nll = torch.nn.functional.cross_entropy
    want = nll(views["attention_dropout"][real], labels[real]) + nll(
        views["future"][:, :-1][real[:, 1:]], labels[:, 1:][real[:, 1:]]
    )  # the future view scores y_{t+1} at t
    got, _ = CVT_TRANSLATION.loss(model, batch, metrics=False)  # eval mode: no dropout, the same targets
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_cvt_translation_on_two_zero2_ranks_matches_one_process_and_resumes_exactly_under_zero3(semi_set, tmp_path):
    run = [
        *QUICK,
        f"data.shards_dir={semi_set}",
        "model.vocab_size=3000",
        "train.max_steps=6",
        "train.lr=3e-3",
        "train.global_batch_size=16",
        "model.dropout=0.0",
        "model.cvt_attention_dropout=0.0",
        "model.cvt_beam=2",
    ]
    one, split = tmp_path / "one", tmp_path / "split"
    run_glm(["train", "-c", CVT_MT, *run, f"train.out_dir={one}", "train.grad_accum_steps=2", "parallel.zero_stage=0"])
    run_glm(
        [
            "train",
            "-c",
            CVT_MT,
            *run,
            f"train.out_dir={split}",
            "parallel.zero_stage=2",
            "train.stop_at_step=3",
            "train.save_interval=3",
        ],
        nproc=2,
    )
    # resumed on one process with ZeRO-3 (the teacher decodes outside the engine's forward: its modules' hooks
    # gather their partitions)
    run_glm(
        ["train", "-c", CVT_MT, *run, f"train.out_dir={split}", "parallel.zero_stage=3", "train.grad_accum_steps=2"]
    )
    reference, resumed = train_losses(one), train_losses(split)
    print(
        "CVT translation, one process:",
        [round(x, 5) for x in reference],
        "\ntwo ranks, ZeRO-2, resumed at 3 on one with ZeRO-3:",
        [round(x, 5) for x in resumed],
    )
    assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(reference[:3], resumed[:3])) < 1e-4, (
        reference,
        resumed,
    )
    # After the resume, ZeRO-3 sums in another order (1e-6 apart): the labelled steps agree to 1e-4, but one
    # hypothesis of the teacher's beam search may flip, which moves an unlabelled step's loss (measured once:
    # step 6, 17.03 against 16.90). They agree to 2%.
    assert all(abs(a - b) < 1e-4 for a, b in zip(reference[2::2], resumed[2::2])), (reference, resumed)
    assert all(abs(a - b) < 0.02 * a for a, b in zip(reference[3::2], resumed[3::2])), (reference, resumed)
    labelled, unlabelled = reference[0::2], reference[1::2]  # steps 1, 3, 5: pairs; 2, 4, 6: the views' loss
    assert labelled[-1] < labelled[0] and unlabelled[-1] < unlabelled[0]  # the primary and the views learn
    ev = run_glm(["eval", "-c", CVT_MT, *run, "--checkpoint", str(one / "checkpoints/step_00000006")])
    metrics = json.loads(ev.stdout[ev.stdout.index("{") :])
    assert metrics["perplexity"] < 4096 and metrics["bleu_pairs"] == 16


def test_cvt_translation_needs_the_auxiliary_decoders_and_a_semi_supervised_set(pair_set, tmp_path):
    with pytest.raises(ConfigError, match="model.cvt_decoders=true"):
        validate(load_config(CVT_MT, ["model.cvt_decoders=false"]), world_size=1)
    proc = run_glm(
        [
            "train",
            "-c",
            CVT_MT,
            *QUICK,
            f"data.shards_dir={pair_set}",
            "model.vocab_size=3000",
            "train.max_steps=2",
            f"train.out_dir={tmp_path}",
        ],
        check=False,
    )
    assert proc.returncode == 2 and "data.labelled_pairs" in proc.stderr and "Traceback" not in proc.stderr
