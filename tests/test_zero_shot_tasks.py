"""GPT-2-style zero-shot tasks built offline (data_pipeline/tasks: summarize, translate,
wordnet_qa) and the answer metrics; their YAMLs, variants and scores through lm-eval are tested
in tests/test_harness.py (which builds the task folder once)."""

from __future__ import annotations

import re

import pytest

from data_pipeline.tasks.answers import exact_match, f1
from data_pipeline.tokenize.prepare import is_validation, read_documents


def test_summaries_are_first_sentences_of_held_out_docstrings(corpus):
    from data_pipeline.tasks.summarize import build, sentences

    task = build(read_documents(corpus), max_train=40)
    test, train = task.splits["test"], task.splits["train"]
    assert len(test) >= 3 and len(train) == 40
    assert all(is_validation(r["id"].rsplit("/e", 1)[0], 50) for r in test)
    assert not {r["article"] for r in test} & {r["article"] for r in train}
    for r in test + train:
        assert len(sentences(r["summary"])) == 1 and r["summary"][-1] in ".!?" and len(r["article"].split()) >= 10
    assert sentences("Return x, e.g. 3. Then y. Ok?") == ["Return x, e.g. 3.", "Then y.", "Ok?"]
    assert 0 < task.baselines["rouge1: the article's first sentence"] < 0.6


def test_translation_pairs_are_one_sentence_gettext_messages_split_by_their_english():
    from data_pipeline.tasks.translate import build

    task = build()
    test, train = task.splits["test"], task.splits["train"]
    assert len(test) == 500 and len(train) > 1000
    assert not {r["en"] for r in test} & {r["en"] for r in train}
    for r in test:
        assert r["en"] != r["de"] and r["en"][-1] in ".!?" and "%" not in r["en"] and "\n" not in r["de"]
    assert len({r["catalog"] for r in test}) > 10
    grep = [r for r in test + train if r["catalog"] == "grep"]
    assert all(r["id"].startswith("gettext-de:grep:") for r in grep)
    assert task.settings["skipped"]["not one sentence"] > 0
    assert 0 < task.baselines["bleu: copy the English"] < 10  # German is not English


def test_reading_comprehension_answers_are_words_of_the_document_with_the_previous_turns():
    from data_pipeline.tasks.wordnet_qa import build

    task = build(num_test_docs=50, num_train_docs=10)
    test = task.splits["test"]
    assert len(test) == 150 and len(task.splits["train"]) == 30
    for r in test:
        assert re.search(rf"\b{r['answer']}\b", r["document"]) and r["answer"] not in r["question"].split('"')[1]
    turns = [len(r["history"]) for r in test[:3]]
    assert turns == [0, 1, 2] and test[2]["history"][1]["answer"] == test[1]["answer"]
    assert task.baselines["f1: the longest word of the document"] < 0.35
    assert f1("The Library", ["library"]) == exact_match("a library.", ["Library"]) == 1.0
    assert f1("reading room", ["room"]) == pytest.approx(2 / 3)


def test_python_faq_questions_are_its_headings_and_answers_the_first_sentence_after_them():
    from data_pipeline.tasks.python_faq import build

    task = build()
    test, train = task.splits["test"], task.splits["train"]
    assert len(test) + len(train) > 100 and not {r["id"] for r in test} & {r["id"] for r in train}
    by_id = {r["id"]: r for r in test + train}
    what = by_id["pyfaq:general#what-is-python"]
    assert what["question"] == "What is Python?"
    assert what["answer"] == "Python is an interpreted, interactive, object-oriented programming language."
    assert all(r["paragraph"].startswith(r["answer"]) and r["answer"] for r in test + train)
    assert sum(r["question"].endswith("?") for r in test + train) > 0.9 * len(by_id)
    assert "Table of Contents" not in {r["question"] for r in test + train}  # the pages' navigation is not read
    assert task.baselines["f1: the question repeated"] < 0.3
