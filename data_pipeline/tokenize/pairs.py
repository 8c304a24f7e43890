"""Translation pairs -> a pair shard set (``glm data tokenize`` of a config whose objective reads pairs).

Input: a pair folder (``glm data gettext``: ``train.jsonl`` / ``validation.jsonl`` of ``{id, source,
target}``) and word vectors in GloVe's text format (``glm data vectors``). Output, in ``out_dir``:

- ``tokenizer.json``: the *source* vocabulary -- ``<pad> <unk> <bos> <eos>`` then the vectors'
  words in file order (a GloVe file is sorted by frequency), at most ``vocab_size`` tokens, with the
  ``word`` profile's normalizer and pre-tokenizer. CoVe's encoder reads GloVe(w) for every word
  GloVe has, so its vocabulary is GloVe's; a checkpoint carries this tokenizer, what feature
  export needs;
- ``source_vectors.npy``: (source vocabulary, d) float32, row i the vector of token i (the special
  tokens' rows zero): the frozen input table the model takes at the start of training;
- ``target-tokenizer.json``: a ``word`` profile tokenizer of at most ``target_vocab_size`` tokens
  trained on the training split's targets (the labelled ones'; the same special ids as the source);
- shards of documents whose ``tokens.npy`` is an array of ``PAIR_TOKEN``: the source's token ids
  (``side`` 0) then the target's (``side`` 1); the splits are the pair folder's (held out by
  message id); a pair with no word on a side is skipped (``no_words``);
- ``labelled_pairs`` N > 0 (semi-supervised translation, Cross-View Training): only the N training
  pairs with the smallest hash of their message id keep their targets; the others are written to
  the ``unlabelled`` split with their source alone (PAIR_TOKEN rows of side 0);
- ``validation-pairs.jsonl``: the held-out pairs' raw text in shard order (BLEU's references);
- ``manifest.json``, written last.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tokenizers import Tokenizer, models

from data_pipeline.cooccur.vectors import read_text
from data_pipeline.errors import PipelineError
from data_pipeline.tokenize.profiles import PROFILES, special_ids, train_tokenizer
from data_pipeline.tokenize.word import word_level
from data_pipeline.writers.shards import INDEX_FORMAT, ShardSetWriter, write_bytes, write_manifest

FORMAT = "glm-dist/translation-pairs/v1"
PAIR_TOKEN = np.dtype([("token", "<u4"), ("side", "u1")])
SOURCE, TARGET = 0, 1
PROFILE = "word"
MAX_LINE_BYTES = 1 << 20  # a gettext message is at most a few KB


@dataclass(frozen=True)
class PairSpec:
    source: str  # the pair folder
    out_dir: str
    vectors: str  # GloVe text vectors: the source vocabulary and CoVe's inputs
    vocab_size: int = 100_000  # source tokens kept (specials included)
    target_vocab_size: int = 8192
    shard_max_bytes: int = 64 * 2**20
    labelled_pairs: int = 0  # > 0: the training pairs that keep their target; the rest's sources are 'unlabelled'


def read_pairs(path: Path) -> Iterator[dict]:
    """The rows of a pair file, each line bounded; a line that is not a pair stops with its number."""
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            try:
                row = json.loads(line) if len(line) <= MAX_LINE_BYTES else None
            except ValueError:
                row = None
            if not isinstance(row, dict) or not all(isinstance(row.get(k), str) for k in ("id", "source", "target")):
                raise PipelineError(
                    f"{path}:{number}: not a translation pair (a JSON object with string id, source "
                    f"and target); write pair files with glm data gettext"
                )
            yield row


def source_tokenizer(words: list[str], vocab_size: int) -> tuple[Tokenizer, np.ndarray]:
    """The word-level tokenizer of ``words`` (first occurrence kept, cut to ``vocab_size`` with the
    specials) and, per kept word, its row in the vectors file."""
    specials = PROFILES[PROFILE].specials
    tok, _ = word_level(specials, unk="<unk>", vocab_size=vocab_size)
    vocab = {s: i for i, s in enumerate(specials)}
    rows = []
    for row, word in enumerate(words):
        if len(vocab) >= vocab_size:
            break
        if word and word not in vocab:
            vocab[word] = len(vocab)
            rows.append(row)
    tok.model = models.WordLevel(vocab, unk_token="<unk>")
    return tok, np.asarray(rows, dtype=np.int64)


def _tokenizer_entry(tok: Tokenizer, file: str) -> dict:
    ids = special_ids(tok, PROFILE)
    return {
        "file": file,
        "sha256": hashlib.sha256(tok.to_str().encode()).hexdigest(),
        "profile": PROFILE,
        "kind": PROFILES[PROFILE].kind,
        "vocab_size": tok.get_vocab_size(),
        "eot_id": ids["eot"],
        "special_ids": ids,
    }


def _labelled_ids(path: Path, n: int) -> set[str] | None:
    """The ids of the ``n`` training pairs with the smallest SHA-1 of their id (None: n = 0, all)."""
    if n <= 0 or not path.is_file():
        return None
    digests = sorted((hashlib.sha1(row["id"].encode()).digest(), row["id"]) for row in read_pairs(path))
    return {pair_id for _, pair_id in digests[:n]}


def prepare_pairs(spec: PairSpec) -> dict:
    """Build the pair shard set (see the module docstring); an existing manifest is returned as it is."""
    out = Path(spec.out_dir)
    if (out / "manifest.json").exists():
        return json.loads((out / "manifest.json").read_text())
    folder = Path(spec.source)
    if not (folder / "train.jsonl").is_file():
        raise PipelineError(
            f"data.source={spec.source!r} holds no train.jsonl: point it at a pair folder (glm data gettext --out DIR)"
        )
    if not spec.vectors:
        raise PipelineError(
            "data.vectors is not set: a translation pair set's source vocabulary and inputs are "
            "GloVe vectors (glm data vectors --out FILE)"
        )
    words, vectors = read_text(spec.vectors, max_words=spec.vocab_size + 1000)
    src, rows = source_tokenizer(words, spec.vocab_size)
    table = np.zeros((src.get_vocab_size(), vectors.shape[1]), dtype=np.float32)
    table[len(PROFILES[PROFILE].specials) :] = vectors[rows]
    labelled = _labelled_ids(folder / "train.jsonl", spec.labelled_pairs)  # None: all
    tgt = train_tokenizer(
        PROFILE,
        (
            r["target"] for r in read_pairs(folder / "train.jsonl") if labelled is None or r["id"] in labelled
        ),  # no unlabelled pair's target
        vocab_size=spec.target_vocab_size,
    )
    if special_ids(tgt, PROFILE)["all_specials"] != special_ids(src, PROFILE)["all_specials"]:
        raise PipelineError("the source and target tokenizers disagree on the special ids")
    out.mkdir(parents=True, exist_ok=True)
    write_bytes(str(out / "tokenizer.json"), src.to_str().encode())
    write_bytes(str(out / "target-tokenizer.json"), tgt.to_str().encode())
    buf = io.BytesIO()
    np.save(buf, table, allow_pickle=False)
    write_bytes(str(out / "source_vectors.npy"), buf.getvalue())
    skipped, counts, shards = Counter(), Counter(), {}
    unlabelled = ShardSetWriter(str(out), "unlabelled", spec.shard_max_bytes) if labelled is not None else None
    for split in ("train", "validation"):
        writer = ShardSetWriter(str(out), split, spec.shard_max_bytes)
        references = []
        path = folder / f"{split}.jsonl"
        for row in read_pairs(path) if path.is_file() else ():
            s, t = src.encode(row["source"]).ids, tgt.encode(row["target"]).ids
            if not s or not t:
                skipped["no_words"] += 1
                continue
            source_only = split == "train" and labelled is not None and row["id"] not in labelled
            if source_only:
                t = []
            tokens = np.zeros(len(s) + len(t), dtype=PAIR_TOKEN)
            tokens["token"], tokens["side"][len(s) :] = s + t, TARGET
            counts["unknown_source"] += s.count(src.token_to_id("<unk>"))
            counts["source_tokens"] += len(s)
            (unlabelled if source_only else writer).write(
                hashlib.sha1(row["id"].encode()).hexdigest()[:16],
                tokens,
                {"id": row["id"], "n_bytes": len(row["source" if source_only else "target"].encode())},
            )
            if split == "validation":
                references.append({"id": row["id"], "source": row["source"], "target": row["target"]})
        shards[split] = [vars(i) for i in writer.close() if i.num_samples]
        counts[split] = sum(i["num_samples"] for i in shards[split])
        if split == "validation":
            write_bytes(
                str(out / "validation-pairs.jsonl"),
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in references).encode(),
            )
    if unlabelled is not None:
        shards["unlabelled"] = [vars(i) for i in unlabelled.close() if i.num_samples]
        counts["unlabelled"] = sum(i["num_samples"] for i in shards["unlabelled"])
        if not shards["unlabelled"]:
            raise PipelineError(
                f"data.labelled_pairs={spec.labelled_pairs} keeps every training pair labelled: "
                f"set it below the {counts['train']} pairs of {folder / 'train.jsonl'}"
            )
    manifest = {
        "format": FORMAT,
        "index_format": INDEX_FORMAT,
        "tokenizer": _tokenizer_entry(src, "tokenizer.json"),
        "target_tokenizer": _tokenizer_entry(tgt, "target-tokenizer.json"),
        "source_vectors": {
            "file": "source_vectors.npy",
            "rows": int(table.shape[0]),
            "dim": int(table.shape[1]),
            "vectors": spec.vectors,
        },
        "references": "validation-pairs.jsonl",
        "splits": shards,
        "source": {
            "spec": spec.source,
            "documents": counts["train"] + counts["validation"] + counts["unlabelled"],
            "labelled_pairs": counts["train"],
            "unlabelled_sources": counts["unlabelled"],
            "skipped": dict(skipped),
            "source_unknown_rate": counts["unknown_source"] / max(counts["source_tokens"], 1),
        },
    }
    write_manifest(str(out), manifest)
    return manifest
