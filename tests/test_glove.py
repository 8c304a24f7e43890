"""GloVe: co-occurrence counts equal a direct count and rebuild the same after an interrupted run, the
triple stream resumes exactly and covers every count once per pass, the WordNet reader, and the
tiny recipe end to end -- counts, training through the trainer, vectors in GloVe's text format whose
WordNet synonyms are closer than random pairs (ROC AUC >= 0.6)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from data_pipeline import wordnet
from data_pipeline.cooccur.counts import CooccurSpec, build_counts
from data_pipeline.cooccur.vectors import read_text
from data_pipeline.errors import PipelineError
from data_pipeline.tokenize.prepare import prepare_shards
from glm_dist.data.loader import Loader
from glm_dist.data.shards import read_manifest, read_shard
from tests.conftest import ROOT, clean_env

GLOVE = str(ROOT / "configs/experiments/glove-tiny-cpu.yaml")
WORDS = "alpha beta gamma delta eps zeta eta theta iota kappa lam mu".split()


def glm(args: list[str], *, nproc: int = 1, threads: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    """``glm ARGS`` with one thread per process: GloVe's small tensors lose more to a second
    thread's synchronisation on a busy 2-core machine than they gain."""
    cmd = (
        [sys.executable, "-m", "glm_dist.cli", *args]
        if nproc == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "glm_dist.cli",
            *args,
        ]
    )
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(threads), capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stderr[-6000:]}")
    return proc


def last_json(stdout: str) -> dict:
    """The JSON a command prints last (DeepSpeed may log to stdout before it)."""
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def small_tokens(tmp_path_factory) -> Path:
    """A word-level token set of a small random corpus (several shards), under a count set's tokens/."""
    rng = np.random.default_rng(0)
    corpus = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    docs = [" ".join(rng.choice(WORDS, size=rng.integers(1, 40)).tolist() + ["zzz"] * (i % 3)) for i in range(60)]
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    root = tmp_path_factory.mktemp("counts")
    prepare_shards(
        source=str(corpus),
        out_dir=str(root / "a/tokens"),
        profile="word",
        vocab_size=12,
        shard_max_bytes=1024,
        workers=1,
    )
    return root


def direct_counts(tokens_dir: Path, window: int) -> dict[tuple[int, int], float]:
    manifest = read_manifest(str(tokens_dir))
    specials = set(manifest["tokenizer"]["special_ids"]["all_specials"])
    counts: dict[tuple[int, int], float] = defaultdict(float)
    for shard in manifest["splits"]["train"]:
        for doc in read_shard(f"{tokens_dir}/{shard['name']}"):
            ids = [int(t) for t in doc.tokens if int(t) not in specials]
            for a in range(len(ids)):
                for b in range(a + 1, min(a + window + 1, len(ids))):
                    counts[ids[a], ids[b]] += 1 / (b - a)
                    counts[ids[b], ids[a]] += 1 / (b - a)
    return counts


def stored_triples(root: Path, split: str = "train") -> np.ndarray:
    manifest = read_manifest(str(root))
    return np.concatenate([d.tokens for s in manifest["splits"][split] for d in read_shard(f"{root}/{s['name']}")])


def spec(root: Path) -> CooccurSpec:
    return CooccurSpec(out_dir=str(root), reader=read_shard, window=3, blocks=3, block_triples=7, shard_max_bytes=1024)


def test_cooccurrence_counts_equal_a_direct_count(small_tokens):
    root = small_tokens / "a"
    manifest = build_counts(spec(root), workers=1)
    assert manifest["format"] == "glm-dist/cooccurrence/v1" and manifest["tokenizer"]["file"] == "tokens/tokenizer.json"
    assert len(read_manifest(str(root / "tokens"))["splits"]["train"]) > 1  # several map tasks
    assert len(manifest["splits"]["train"]) > spec(root).blocks  # several shards per word block
    triples = stored_triples(root)
    got = {(int(t["word"]), int(t["context"])): float(t["count"]) for t in triples}
    want = direct_counts(root / "tokens", window=3)
    assert len(got) == len(triples) == len(want) == manifest["cooccurrence"]["triples"]  # each pair stored once
    assert max(abs(got[k] - v) for k, v in want.items()) < 1e-5
    assert all(abs(got[i, j] - got[j, i]) < 1e-6 for i, j in got)  # symmetric
    specials = read_manifest(str(root))["tokenizer"]["special_ids"]["all_specials"]
    assert not set(triples["word"]) & set(specials)  # <unk> and the marks never counted


def _shard_hashes(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.glob("train-*.tar"))}


def test_an_interrupted_count_resumes_to_the_same_bytes(small_tokens):
    whole = small_tokens / "a"
    build_counts(spec(whole), workers=1)
    parts = small_tokens / "b"
    parts.mkdir()
    (parts / "tokens").symlink_to(whole / "tokens")
    build_counts(spec(parts), stage="map", task=0)  # a SLURM array's first task, then the job dies
    with pytest.raises(PipelineError, match="map tasks"):
        build_counts(spec(parts), stage="reduce")
    (parts / ".map" / "train-00000-000.npz").write_bytes(b"half-written")  # no marker: it runs again
    (parts / ".tasks" / "map-00000.json").unlink()
    build_counts(spec(parts), workers=2)
    assert _shard_hashes(parts) == _shard_hashes(whole) and _shard_hashes(whole)
    with pytest.raises(PipelineError, match="not co-occurrence counts"):
        build_counts(spec(whole / "tokens"))


def test_triple_stream_resumes_exactly_and_covers_every_count_once_per_pass(small_tokens):
    root = str(small_tokens / "a")
    build_counts(spec(small_tokens / "a"), workers=1)
    total = len(stored_triples(small_tokens / "a"))
    loader = Loader(root, objective="glove", seq_len=5, micro_batch_size=2, seed=3, shuffle_window=2)
    seen = []
    while len(seen) < total:
        batch = loader.next_step()[0]
        seen += list(zip(batch["word_ids"].flatten().tolist(), batch["context_ids"].flatten().tolist()))
    triples = stored_triples(small_tokens / "a")
    assert Counter(seen[:total]) == Counter(zip(triples["word"].tolist(), triples["context"].tolist()))
    state = json.loads(json.dumps(loader.state_dict()))
    ahead = [loader.next_step()[0] for _ in range(6)]
    resumed = Loader(root, objective="glove", seq_len=5, micro_batch_size=2, seed=3, shuffle_window=2)
    resumed.load_state_dict(state)
    for want in ahead:
        got = resumed.next_step()[0]
        assert all(bool((got[k] == want[k]).all()) for k in ("word_ids", "context_ids", "counts"))


def test_glove_refuses_a_token_shard_set(small_tokens):
    loader = Loader(str(small_tokens / "a/tokens"), objective="glove", seq_len=5, micro_batch_size=2)
    with pytest.raises(ValueError, match="glm data cooccur"):
        loader.next_step()


def test_wordnet_reader_parses_the_database():
    line = (
        "00001740 29 v 04 breathe 0 take_a_breath 0 respire 0 suspire 3 002 * 00005041 v 0000 + 03110323 a 0301 "
        '02 + 02 00 + 08 00 | draw air into, and expel out of, the lungs; "I can breathe better"; "She respired"  '
    )
    s = wordnet.parse_line(line)
    assert s.lemmas == ("breathe", "take a breath", "respire", "suspire") and s.pos == "v"
    assert s.definition == "draw air into, and expel out of, the lungs"
    assert s.examples == ("I can breathe better", "She respired")
    assert [(p.symbol, p.offset, p.pos, p.source, p.target) for p in s.pointers] == [
        ("*", 5041, "v", 0, 0),
        ("+", 3110323, "a", 3, 1),
    ]
    counts = Counter(s.pos for s in wordnet.synsets())  # WordNet 3.0 (apt-get install wordnet-base)
    assert counts == {"n": 82115, "v": 13767, "a": 7463, "s": 10693, "r": 3621}
    assert wordnet.senses("v")[("breathe", "v")][0] == 1740
    assert ("begin", "start") in wordnet.synonym_pairs(["start", "begin", "car"], first_sense=True)
    assert wordnet.parse_line("02084071 05 n 02 dog 0 domestic_dog 0 000 | a member of the genus Canis").lemmas == (
        "dog",
        "domestic dog",
    )


def synonym_auc(words: list[str], vectors: np.ndarray) -> tuple[float, int]:
    """ROC AUC of cosine similarity: WordNet synonym pairs (both words' most frequent sense) against
    random pairs of the same words; and the number of synonym pairs."""
    index = {w: i for i, w in enumerate(words)}
    pairs = sorted(wordnet.synonym_pairs(words, first_sense=True))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-8)
    candidates = sorted({w for p in pairs for w in p})
    rng = np.random.default_rng(0)
    drawn = rng.choice(len(candidates), size=(20000, 2))
    random_pairs = [
        (candidates[a], candidates[b])
        for a, b in drawn
        if a != b and tuple(sorted((candidates[a], candidates[b]))) not in set(pairs)
    ]

    def cosines(ps):
        return np.einsum("ij,ij->i", unit[[index[a] for a, _ in ps]], unit[[index[b] for _, b in ps]])

    syn, rand = cosines(pairs), cosines(random_pairs)
    ranks = np.concatenate([syn, rand]).argsort().argsort() + 1
    return float((ranks[: len(syn)].sum() - len(syn) * (len(syn) + 1) / 2) / (len(syn) * len(rand))), len(pairs)


@pytest.mark.slow
def test_tiny_glove_recipe_trains_vectors_whose_synonyms_are_closer_than_random_pairs(tmp_path):
    counts, out = tmp_path / "counts", tmp_path / "run"
    made = last_json(glm(["data", "cooccur", "-c", GLOVE, f"data.shards_dir={counts}"]).stdout)
    assert made["window"] == 10 and made["triples"] > 500_000
    # a glove config's tokenize: the same set
    again = glm(["data", "tokenize", "-c", GLOVE, f"data.shards_dir={counts}"])
    assert last_json(again.stdout) == made
    proc = glm(
        [
            "train",
            "-c",
            GLOVE,
            f"data.shards_dir={counts}",
            f"train.out_dir={out}",
            "logging.wandb=false",
            "logging.progress=false",
            "train.plot=false",
        ]
    )
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert summary["val_loss"] < 0.1 * summary["val_loss_before"], summary
    # a least-squares loss has no perplexity: the log reports the loss, never "perplexity nan"
    assert "validation loss: " in proc.stderr and not re.search(r"\bnan\b", proc.stderr, re.I), proc.stderr[-2000:]
    vec = glm(
        ["data", "vectors", "--checkpoint", str(out / "checkpoints/step_00001200"), "--out", str(tmp_path / "v.txt")]
    )
    exported = last_json(vec.stdout)
    assert exported["dim"] == 50
    words, vectors = read_text(str(tmp_path / "v.txt"))
    assert len(words) == exported["words"] > 4000 and vectors.shape == (len(words), 50)
    auc, n = synonym_auc(words, vectors)
    print(f"WordNet synonym pairs vs random pairs: ROC AUC {auc:.3f} over {n} pairs")
    assert n >= 100 and auc >= 0.6, (auc, n)
