"""Evaluation tasks built offline from text on this machine: each builder returns its splits (rows
with a stable ``id``), the trivial baselines to read its scores against, and a data card saying
where the text comes from. ``built.write_task`` puts them in a folder; lm-eval reads them through the
task YAMLs of ``glm_dist/eval/tasks`` (``glm data eval-tasks``)."""

from __future__ import annotations

from typing import Callable

from data_pipeline.tasks.built import BuiltTask


def builders() -> dict[str, Callable[..., BuiltTask]]:
    from data_pipeline.tasks import cloze, docstring_mc, python_faq, summarize, translate, wordnet_mc, wordnet_qa

    return {
        "pydoc_cloze": cloze.build,
        "wordnet_mc": wordnet_mc.build,
        "docstring_mc": docstring_mc.build,
        "doc_summary": summarize.build,
        "translation_de": translate.build,
        "wordnet_qa": wordnet_qa.build,
        "python_faq": python_faq.build,
    }
