"""Cross-View Training: the python3-doc reference tags and the WordNet part-of-speech task, the tagging
shard set, the model's restricted views, padding invariance, the auxiliary loss that never reaches a
primary module, span F1 against seqeval, the alternating loader and its exact resume, training through
glm train (ZeRO-2 on two ranks equal to one process, resumed), the layouts refused and the published
recipe's plan."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from data_pipeline.tasks import pydoc_xref, wordnet_pos
from data_pipeline.tasks.tagging_shards import TaggingTask, write_tagging_shards
from data_pipeline import wordnet
from glm_dist.data.alternating import AlternatingLoader, TagsMismatch
from glm_dist.data.loader import validation_batches
from glm_dist.families.cvt.model import CVT, VIEWS, cvt_config
from glm_dist.objectives.cvt import CVT as OBJECTIVE, TaggingOptions, spans, span_counts
from glm_dist.objectives.registry import collate
from tests.conftest import ROOT, train_losses
from tests.test_glove import glm as run_glm  # one thread per process

CONFIG = str(ROOT / "configs/experiments/cvt-tiny-cpu.yaml")
PAGES = "library/[j-l]*.html"  # json, keyword, linecache, locale, logging, ...: a few seconds to read
QUICK = [
    "train.eval_interval=0",
    "train.eval_batches=4",
    "train.micro_batch_size=8",
    "logging.wandb=false",
    "logging.progress=false",
    "train.plot=false",
    "train.save_interval=0",
    "model.flavor=cvt-tiny-words",
    "train.warmup_steps=2",
]


@pytest.fixture(scope="module")
def xref():
    splits = pydoc_xref.xref_splits(pattern=PAGES)
    return TaggingTask("pydoc_xref", pydoc_xref.TAGS, splits["labelled"], splits["test"]), splits["unlabelled"]


@pytest.fixture(scope="module")
def tagging(xref, tmp_path_factory):
    """A two-task tagging shard set: the references (120 labelled, 100 held out) and WordNet (120 of
    the first 3000 examples, 100 held out)."""
    task, unlabelled = xref
    pos = wordnet_pos.wordnet_pos_splits(limit=3000)
    tasks = [
        TaggingTask(task.name, task.tags, task.labelled, task.test[:100]),
        TaggingTask("wordnet_pos", wordnet_pos.TAGS, pos["labelled"], pos["test"][:100]),
    ]
    out = str(tmp_path_factory.mktemp("tagging"))
    write_tagging_shards(
        out, tasks, unlabelled[:400], labelled_limit=[120, 120], vocab_size=4000, shard_max_bytes=16 * 1024
    )
    return out


def tiny(**kw) -> CVT:
    torch.manual_seed(0)
    return CVT(cvt_config("cvt-tiny", vocab_size=60, tags=(17, 9), **kw))


# -- the tasks -----------------------------------------------------------------------------------------


def test_pydoc_references_are_tagged_as_the_authors_marked_them(xref):
    task, unlabelled = xref
    json_page = [s for s in task.labelled + task.test + unlabelled if s.source == "library/json.html"]
    tagged = {" ".join(w for w, t in zip(s.words, s.tags) if t != "O"): s for s in json_page}
    dump = next(s for s in json_page if "dump" in s.words and "()" in s.words)
    i = dump.words.index("dump")
    assert dump.tags[i : i + 2] == ("B-func", "I-func")  # <code class="xref py py-func">dump()</code>: one span
    assert any("pickle" in k for k in tagged) and "TypeError" in " ".join(tagged)
    for s in json_page:  # BIO: an I- continues a span of its own role
        for prev, tag in zip(("O",) + s.tags, s.tags):
            assert not tag.startswith("I-") or prev[2:] == tag[2:], s
    pages = {
        split: {s.source for s in rows}
        for split, rows in (("labelled", task.labelled), ("test", task.test), ("unlabelled", unlabelled))
    }
    assert not (pages["labelled"] & pages["test"]) and not (pages["test"] & pages["unlabelled"])  # held out by page
    counts = {r: sum(t == f"B-{r}" for s in task.labelled for t in s.tags) for r in pydoc_xref.ROLES}
    assert all(counts[r] > 0 for r in ("func", "class", "mod", "meth", "exc")), counts


def test_wordnet_examples_tag_the_lemma_with_its_part_of_speech():
    synset = next(s for s in wordnet.synsets("v") if "run" in s.lemmas and any(" ran " in f" {e} " for e in s.examples))
    example = next(e for e in synset.examples if " ran " in f" {e} ")
    words, tags = wordnet_pos.tag_example(example, synset)
    assert tags[words.index("ran")] == "B-VERB" and tags.count("O") == len(tags) - 1  # irregular form (verb.exc)
    rows = wordnet_pos.wordnet_pos_splits(limit=2000)
    assert {t for s in rows["labelled"] for t in s.tags if t != "O"} <= set(wordnet_pos.TAGS)
    assert all(sum(t.startswith("B-") for t in s.tags) == 1 for s in rows["labelled"])


def test_tagging_shards_keep_case_and_number_the_tags_over_tasks(tagging):
    from glm_dist.data.shards import read_manifest

    manifest = read_manifest(tagging)
    tasks = manifest["tagging"]["tasks"]
    assert [(t["name"], len(t["tags"]), t["offset"], t["labelled"]) for t in tasks] == [
        ("pydoc_xref", 17, 0, 120),
        ("wordnet_pos", 9, 17, 120),
    ]
    words = manifest["tokenizer"]["special_ids"]["words"]
    assert "JSONDecodeError" in words or "TypeError" in words  # case kept
    loader = AlternatingLoader(
        tagging, seq_len=72, micro_batch_size=8, options=TaggingOptions(tag_counts=(17, 9)), objective="cvt"
    )
    batch = loader.labelled[1].next_step()[0]
    assert (batch["task"] == 1).all() and ((batch["labels"] == -100) | (batch["labels"] >= 17)).all()
    assert (batch["labels"][:, 0] == -100).all() and (batch["input_ids"][:, 0] == 2).all()  # <bos>, not scored
    with pytest.raises(TagsMismatch, match=r"set model.tags=\[17, 9\]"):
        AlternatingLoader(
            tagging, seq_len=72, micro_batch_size=8, options=TaggingOptions(tag_counts=(17,)), objective="cvt"
        )


# -- the model and the objective ---------------------------------------------------------------------------


def test_each_auxiliary_view_sees_only_its_side():
    model = tiny().eval()
    ids = torch.randint(4, 60, (1, 9))
    chars = torch.randint(1, 262, (1, 9, 50))
    changed_ids, changed_chars = ids.clone(), chars.clone()
    t = 4
    changed_ids[0, t], changed_chars[0, t] = (ids[0, t] + 1) % 60, (chars[0, t] % 200) + 1
    a = model(ids, char_ids=chars, mode="student")["auxiliary"][0]
    b = model(changed_ids, char_ids=changed_chars, mode="student")["auxiliary"][0]
    same = {v: [torch.allclose(a[v][0, i], b[v][0, i], atol=1e-6) for i in range(9)] for v in VIEWS}
    assert same["fwd"] == [i < t for i in range(9)]  # h_fwd at i reads words <= i
    assert same["bwd"] == [i > t for i in range(9)]
    assert same["future"] == [i <= t for i in range(9)]  # reads h_fwd at i - 1: never word i itself
    assert same["past"] == [i >= t for i in range(9)]
    p, q = (
        model(x, char_ids=c, mode="supervised")["primary"][0] for x, c in ((ids, chars), (changed_ids, changed_chars))
    )
    assert not torch.allclose(p[0, 0], q[0, 0]) and not torch.allclose(p[0, 8], q[0, 8])  # the full view sees all


@pytest.mark.parametrize("mode", ["supervised", "student"])
def test_padding_never_changes_a_result(mode):
    model = tiny().eval()
    long, short = torch.randint(4, 60, (11,)), torch.randint(4, 60, (6,))
    chars = torch.randint(1, 262, (11, 50))
    batch = collate(
        [
            {"input_ids": long.numpy(), "char_ids": chars.numpy()},
            {"input_ids": short.numpy(), "char_ids": chars[:6].numpy()},
        ],
        pad_id=0,
    )
    both = model(batch["input_ids"], char_ids=batch["char_ids"], attention_mask=batch["attention_mask"], mode=mode)
    alone = model(short[None], char_ids=chars[None, :6], mode=mode)
    pairs = (
        zip(both["primary"], alone["primary"])
        if mode == "supervised"
        else ((x[v], y[v]) for x, y in zip(both["auxiliary"], alone["auxiliary"]) for v in VIEWS)
    )
    for padded, single in pairs:
        assert torch.allclose(padded[1, :6], single[0], atol=1e-5)


def test_auxiliary_loss_reaches_the_encoder_and_never_a_primary_module(tagging):
    loader = AlternatingLoader(
        tagging,
        seq_len=24,
        micro_batch_size=4,
        objective="cvt",  # short: the LSTMP loop
        options=TaggingOptions(tag_counts=(17, 9)),
    )
    model = CVT(cvt_config("cvt-tiny", vocab_size=4000, tags=(17, 9))).train()
    unlabelled = loader.unlabelled.next_step()[0]
    assert "labels" not in unlabelled
    loss, _ = OBJECTIVE.loss(model, unlabelled, metrics=False)
    loss.backward()
    assert loss.item() > 0
    assert all(p.grad is None for p in model.primary.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.auxiliary.parameters())
    assert model.layer1[0].lstm.weight_hh_l0.grad.abs().sum() > 0 and model.embed.weight.grad.abs().sum() > 0
    assert model.layer2[0].lstm.weight_hh_l0.grad is None  # the views read layer 1 only
    model.zero_grad(set_to_none=True)
    labelled = loader.labelled[0].next_step()[0]
    OBJECTIVE.loss(model, labelled, metrics=False)[0].backward()
    assert all(p.grad is None for p in model.auxiliary.parameters())
    assert model.primary[0].out.weight.grad.abs().sum() > 0
    assert model.primary[1].out.weight.grad.abs().sum() == 0  # task 1's module: no row of its task
    torch.manual_seed(1)  # the teacher runs without dropout, the student with it
    ids = unlabelled["input_ids"]
    kw = dict(char_ids=unlabelled["char_ids"], attention_mask=unlabelled.get("attention_mask"))
    t1, t2 = (model(ids, mode="teacher", **kw)["primary"][0] for _ in range(2))
    s1, s2 = (model(ids, mode="student", **kw)["auxiliary"][0]["fwd"] for _ in range(2))
    assert torch.equal(t1, t2) and not torch.equal(s1, s2)


def test_span_f1_is_seqeval_s(xref):
    from seqeval.metrics import f1_score

    task, _ = xref
    rows = [s for s in task.test if any(t != "O" for t in s.tags)][:200]
    tag_id = {t: i for i, t in enumerate(pydoc_xref.TAGS)}
    rng = np.random.default_rng(0)
    gold = [[tag_id[t] for t in s.tags] for s in rows]
    pred = [[int(rng.integers(17)) if rng.random() < 0.15 else t for t in row] for row in gold]  # corrupted copies
    width = max(map(len, gold))
    pad = lambda rows: torch.tensor([r + [-100] * (width - len(r)) for r in rows])  # noqa: E731
    tp, npred, ngold = span_counts(pad(pred).clamp(min=0), pad(gold))
    ours = 2 * tp / (npred + ngold)
    names = [[pydoc_xref.TAGS[i] for i in r] for r in gold], [[pydoc_xref.TAGS[i] for i in r] for r in pred]
    assert ours == pytest.approx(f1_score(*names), abs=1e-9) and 0.3 < ours < 0.95
    assert spans([0, 2, 2, 1, 4, 0]) == {(0, 1, 3), (0, 3, 4), (1, 4, 5)}  # I after O opens a span; B splits


def test_alternating_loader_alternates_and_resumes_exactly(tagging):
    kw = dict(seq_len=72, micro_batch_size=4, objective="cvt", seed=3, options=TaggingOptions(tag_counts=(17, 9)))
    loader = AlternatingLoader(tagging, **kw)
    kinds = []
    for _ in range(12):
        batch = loader.next_step()[0]
        kinds.append(int(batch["task"][0]) if "labels" in batch else "u")
    assert kinds[1::2] == ["u"] * 6 and set(kinds[0::2]) == {0, 1}  # a random task on each labelled step
    state = json.loads(json.dumps(loader.state_dict()))
    ahead = [loader.next_step()[0] for _ in range(5)]
    resumed = AlternatingLoader(tagging, **kw)
    resumed.load_state_dict(state)
    for a, b in zip(ahead, [resumed.next_step()[0] for _ in range(5)]):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    supervised = AlternatingLoader(
        tagging, **{**kw, "options": TaggingOptions(tag_counts=(17, 9), cvt_unlabelled=False)}
    )
    assert supervised.unlabelled is None and all("labels" in supervised.next_step()[0] for _ in range(4))
    with pytest.raises(ValueError, match="unlabelled steps"):
        supervised.load_state_dict(state)
    val = validation_batches(tagging, seq_len=72, micro_batch_size=50, num_batches=10, objective="cvt")
    assert sum(int(b["task"].eq(k).sum()) for b, w in val if w for k in (0, 1)) == sum(
        len(b["task"]) for b, w in val if w
    )


# -- training through glm train ----------------------------------------------------------------------------


def train_args(shards: str, out, *extra: str) -> list[str]:
    return [
        "train",
        "-c",
        CONFIG,
        *QUICK,
        f"data.shards_dir={shards}",
        f"train.out_dir={out}",
        "model.tags=[17,9]",
        *extra,
    ]


@pytest.mark.slow
def test_zero2_on_two_ranks_matches_one_process_and_resumes_exactly(tagging, tmp_path):
    run = [
        "train.max_steps=6",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "model.dropout=0.0",
        "model.unlabelled_dropout=0.0",
        "train.lr=3e-3",
        "train.schedule=constant",
    ]
    one = tmp_path / "one"
    proc = run_glm(
        train_args(tagging, one, *run, "train.grad_accum_steps=2", "parallel.zero_stage=0", "train.eval_batches=50")
    )  # the 200 held-out sentences: task 0's spans and task 1's
    split = tmp_path / "split"  # two ranks with ZeRO-2, stopped after step 3, resumed on one process
    run_glm(train_args(tagging, split, *run, "parallel.zero_stage=2", "train.stop_at_step=3"), nproc=2)
    run_glm(train_args(tagging, split, *run, "parallel.zero_stage=2", "train.grad_accum_steps=2"))
    reference, resumed = train_losses(one), train_losses(split)
    print(
        "one process:",
        [round(x, 5) for x in reference],
        "\ntwo ranks, ZeRO-2, resumed at 3 on one:",
        [round(x, 5) for x in resumed],
    )
    assert len(resumed) == 6 and max(abs(a - b) for a, b in zip(reference, resumed)) < 1e-4, (reference, resumed)
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert {"val_f1", "val_precision", "val_recall", "val_f1_task1", "val_accuracy"} <= summary.keys()


@pytest.mark.parametrize("layout", ["parallel.pipeline_stages=2", "parallel.tensor_parallel=2"])
def test_layouts_cvt_does_not_split_are_refused(layout):
    from glm_dist.config.checks import validate
    from glm_dist.config.loader import ConfigError, load_config

    with pytest.raises(ConfigError, match="cvt"):
        validate(load_config(CONFIG, [layout]), world_size=2)


def test_published_cvt_recipe_validates_and_plans():
    from glm_dist.config.checks import validate
    from glm_dist.config.loader import load_config

    recipe = str(ROOT / "configs/experiments/published/cvt.yaml")
    planned = json.loads(run_glm(["plan", "-c", recipe, "--gpus", "1", "--json"]).stdout)
    assert planned["recommended"] is not None and {(lay["pp"], lay["tp"]) for lay in planned["layouts"]} == {(1, 1)}
    cfg = load_config(recipe)
    validate(cfg)
    assert (cfg.model.family, cfg.model.flavor, cfg.train.micro_batch_size, cfg.model.dropout) == (
        "cvt",
        "cvt",
        64,
        0.5,
    )
    with torch.device("meta"):
        model = CVT(cvt_config("cvt"))
    assert model.layer1[0].lstm.hidden_size == 1024 and model.layer1[0].lstm.proj_size == 512
    assert model.layer2[0].lstm.hidden_size == 512 and model.embed.embedding_dim == 300
