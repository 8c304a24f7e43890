"""Sequence-labelling tasks and unlabelled sentences as one shard set that ``glm train`` reads
(Cross-View Training: ``objective.name=cvt``).

Each document is one sentence: a structured array of ``TAGGED`` records, one per word -- its token
id, its tag (in one tag space over all tasks: task k's tags are numbered from the sum of the
earlier tasks' tag counts) and its task; an unlabelled sentence has tag and task -1. Splits:
``train`` the unlabelled sentences, ``labelled-<k>`` task k's training sentences (``labelled_limit``
of them -- one limit, or one per task -- drawn with ``subset_seed + k``), ``validation`` every
task's held-out sentences. The tokenizer is the ``word`` profile's kind (WordLevel over the same
``\\w+ | [^\\w\\s]+`` words) but keeps case -- ``List`` is not ``list`` -- and is trained on the
unlabelled and the labelled training words, never the held-out ones. ``manifest.json`` (written
last) lists the tasks and their tags under ``tagging``.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass
from typing import Sequence

import fsspec
import numpy as np
from tokenizers import Tokenizer, normalizers

from data_pipeline.errors import PipelineError
from data_pipeline.tasks.pydoc_xref import TaggedSentence
from data_pipeline.tokenize.profiles import PROFILES, special_ids
from data_pipeline.tokenize.word import word_level
from data_pipeline.writers.shards import INDEX_FORMAT, ShardSetWriter, write_bytes, write_manifest

TAGGED = np.dtype([("token", "<i4"), ("tag", "<i2"), ("task", "<i2")])
FORMAT = "glm-dist/tagging/v1"
PROFILE = "word"  # its special tokens and roles


@dataclass(frozen=True)
class TaggingTask:
    name: str
    tags: tuple[str, ...]  # "O" first, then B-/I- tags
    labelled: Sequence[TaggedSentence]
    test: Sequence[TaggedSentence]


def cased_tokenizer(texts: Sequence[str], *, vocab_size: int, min_frequency: int = 1) -> Tokenizer:
    p = PROFILES[PROFILE]
    tok, trainer = word_level(p.specials, unk=p.roles["unk"], vocab_size=vocab_size, min_frequency=min_frequency)
    tok.normalizer = normalizers.NFKC()  # case kept
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode(
    sentence: TaggedSentence, vocab: dict[str, int], unk: int, normalize, *, tag_ids: dict | None, task: int
) -> np.ndarray:
    out = np.empty(len(sentence.words), dtype=TAGGED)
    out["token"] = [vocab.get(normalize(w), unk) for w in sentence.words]
    out["tag"] = [tag_ids[t] for t in sentence.tags] if tag_ids is not None else -1
    out["task"] = task
    return out


def bio_roles(tags: Sequence[str]) -> list[str]:
    """The roles of a tag list, in the order of their B- tags."""
    return [t[2:] for t in tags if t.startswith("B-")]


def subset(rows: Sequence[TaggedSentence], limit: int | None, seed: int) -> list[TaggedSentence]:
    """``limit`` rows drawn with ``seed`` (all rows, in their order, when ``limit`` is None)."""
    rows = list(rows)
    if limit is None or limit >= len(rows):
        return rows
    return random.Random(seed).sample(rows, limit)


def write_tagging_shards(
    out_dir: str,
    tasks: Sequence[TaggingTask],
    unlabelled: Sequence[TaggedSentence],
    *,
    labelled_limit: int | Sequence[int | None] | None = None,
    subset_seed: int = 0,
    vocab_size: int = 16384,
    shard_max_bytes: int = 16 * 2**20,
) -> dict:
    """Write the shard set (see the module docstring); returns its manifest."""
    for t in tasks:
        if list(t.tags) != ["O", *(f"{b}-{r}" for r in bio_roles(t.tags) for b in "BI")]:
            raise PipelineError(f"task {t.name}: tags must be O, then B-r, I-r per role (got {list(t.tags)[:5]} ...)")
    limits = labelled_limit if isinstance(labelled_limit, (list, tuple)) else [labelled_limit] * len(tasks)
    labelled = [subset(t.labelled, limit, subset_seed + k) for k, (t, limit) in enumerate(zip(tasks, limits))]
    texts = [" ".join(s.words) for rows in [unlabelled, *labelled] for s in rows]
    tok = cased_tokenizer(texts, vocab_size=vocab_size)
    fs, root = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(root, exist_ok=True)
    ids = special_ids(tok, PROFILE)
    vocab, normalize = tok.get_vocab(), tok.normalizer.normalize_str
    write_bytes(f"{out_dir}/tokenizer.json", tok.to_str().encode())
    offsets = np.cumsum([0] + [len(t.tags) for t in tasks]).tolist()
    tag_ids = [{tag: offsets[k] + i for i, tag in enumerate(t.tags)} for k, t in enumerate(tasks)]
    splits: dict[str, list[tuple[TaggedSentence, dict | None, int]]] = {
        "train": [(s, None, -1) for s in unlabelled],
        **{f"labelled-{k}": [(s, tag_ids[k], k) for s in rows] for k, rows in enumerate(labelled)},
        "validation": [(s, tag_ids[k], k) for k, t in enumerate(tasks) for s in t.test],
    }
    infos = {}
    for split, rows in splits.items():
        writer = ShardSetWriter(out_dir, split, shard_max_bytes, prefix=split)
        for i, (sentence, tags, task) in enumerate(rows):
            writer.write(
                f"{split}-{i:08d}",
                encode(sentence, vocab, ids["unk"], normalize, tag_ids=tags, task=task),
                {"source": sentence.source},
            )
        infos[split] = [asdict(info) for info in writer.close() if info.num_samples]
    manifest = {
        "format": "glm-dist/tokenized-documents/v2",
        "index_format": INDEX_FORMAT,
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
            "profile": PROFILE,
            "kind": PROFILES[PROFILE].kind,
            "vocab_size": tok.get_vocab_size(),
            "eot_id": ids["eot"],
            "special_ids": ids,
            "cased": True,
        },
        "splits": infos,
        "tagging": {
            "format": FORMAT,
            "unlabelled": len(unlabelled),
            "labelled_limit": labelled_limit,
            "subset_seed": subset_seed,
            "tasks": [
                {
                    "name": t.name,
                    "tags": list(t.tags),
                    "offset": offsets[k],
                    "labelled": len(labelled[k]),
                    "test": len(t.test),
                }
                for k, t in enumerate(tasks)
            ],
        },
    }
    write_manifest(out_dir, manifest)
    return manifest


def xref_task(root: str | None = None, **kw) -> tuple[TaggingTask, list[TaggedSentence]]:
    """The pydoc reference-tagging task and the unlabelled pages' sentences."""
    from data_pipeline.tasks import pydoc_xref

    splits = pydoc_xref.xref_splits(root, **kw)
    return TaggingTask("pydoc_xref", pydoc_xref.TAGS, splits["labelled"], splits["test"]), splits["unlabelled"]


def wordnet_task(root: str | None = None) -> TaggingTask:
    from data_pipeline.tasks import wordnet_pos

    splits = wordnet_pos.wordnet_pos_splits(root)
    return TaggingTask("wordnet_pos", wordnet_pos.TAGS, splits["labelled"], splits["test"])


TASKS = ("pydoc_xref", "wordnet_pos")
UNLABELLED_SEED = 1234  # which unlabelled sentences a limit keeps: the same for every labelled size


def build_tagging_set(
    out_dir: str,
    *,
    tasks: Sequence[str] = ("pydoc_xref",),
    labelled_limit: int | Sequence[int | None] | None = None,
    unlabelled_limit: int | None = None,
    test_limit: int | None = None,
    subset_seed: int = 0,
    vocab_size: int = 16384,
    pydoc_root: str | None = None,
    wordnet_root: str | None = None,
    pattern: str = "**/*.html",
    max_pages: int | None = None,
) -> dict:
    """``glm data tagging``: the named tasks (``pydoc_xref`` first: its unlabelled pages are the
    unlabelled text), ``labelled_limit`` training sentences (per task, or a list), ``unlabelled_limit``
    unlabelled and ``test_limit`` held-out sentences per task (fixed draws)."""
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks or tasks[0] != "pydoc_xref":
        raise PipelineError(f"tagging tasks {list(tasks)}: pydoc_xref first, then any of {', '.join(TASKS[1:])}")
    xref, unlabelled = xref_task(pydoc_root, pattern=pattern, max_pages=max_pages)
    built = [xref] + [wordnet_task(wordnet_root) for t in tasks[1:] if t == "wordnet_pos"]
    built = [TaggingTask(t.name, t.tags, t.labelled, subset(t.test, test_limit, UNLABELLED_SEED)) for t in built]
    return write_tagging_shards(
        out_dir,
        built,
        subset(unlabelled, unlabelled_limit, UNLABELLED_SEED),
        labelled_limit=labelled_limit,
        subset_seed=subset_seed,
        vocab_size=vocab_size,
    )
