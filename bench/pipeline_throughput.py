"""Crawl-pipeline throughput and rule agreement: glm-dist beside datatrove and datasketch.

The same WARC file (pydoc's HTML documentation of the standard library: real documentation pages
with navigation, tables and code) goes through

- ours: WARC reader -> resiliparse extraction -> py3langid -> Gopher repetition -> Gopher quality -> C4 -> FineWeb
- datatrove: WarcReader -> Trafilatura -> GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter
  -> FineWebQualityFilter (datatrove's language filter downloads a fastText model at run time, which this
  machine cannot; its row runs without language ID, and ours is shown both with and without it),

one process each (documents/s per core). Then both rule implementations judge the *same* extracted
texts (ours) with the same thresholds, and the keep/drop agreement per rule set is printed. Last,
MinHash signatures (112 permutations, word 5-grams) for the same texts: ours beside datasketch's.

    pip install -e .[bench]        # datatrove[processing], spacy (its English word tokenizer), datasketch
    python bench/pipeline_throughput.py [--pages 400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data_pipeline.document import Stats  # noqa: E402
from data_pipeline.recipe import Recipe  # noqa: E402
from data_pipeline.sample_crawl import response_records  # noqa: E402

RENDER = r"""
import importlib, io, json, pydoc, sys, warnings
warnings.simplefilter("ignore")
skip = {"this", "antigravity", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc", "curses", "sys"}
out, sys.stdout = sys.stdout, io.StringIO()
for name in sorted(sys.stdlib_module_names):
    if name.startswith("_") or name in skip:
        continue
    try:
        module = importlib.import_module(name)
        page = pydoc.HTMLDoc().page(name, pydoc.HTMLDoc().docmodule(module))
    except BaseException:
        continue
    out.write(json.dumps({"name": name, "html": page}) + "\n")
out.flush()
"""


def pydoc_warc(path: str, pages: int) -> tuple[int, int]:
    proc = subprocess.run(
        [sys.executable, "-c", RENDER],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd="/",
    )
    rendered = [json.loads(line) for line in proc.stdout.splitlines()]
    total = 0
    with open(path, "wb") as f:
        for i in range(pages):
            page = rendered[i % len(rendered)]
            body = page["html"].encode()
            total += len(body)
            f.write(
                response_records(
                    f"https://docs.python.example/{i}/{page['name']}.html", "text/html; charset=utf-8", body
                )
            )
    return pages, total


def ours(path: str, language: bool) -> tuple[float, int, list[str]]:
    from data_pipeline.filters.steps import apply, build_steps
    from data_pipeline.readers import read

    recipe = Recipe(
        input=[path],
        output="/tmp/unused",
        stages=["extract", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb"],
    )
    recipe.language.enabled = language
    stats = Stats()
    steps = build_steps(recipe, stats)
    if language:  # load the language model before the clock starts (once per process)
        from data_pipeline.filters.language import identify

        identify("warm up")
    start, kept = time.perf_counter(), 0
    for doc in read(path, recipe.reader, stats):
        reason, _ = apply(doc, steps, stats, path)
        kept += reason is None
    return time.perf_counter() - start, kept, []


def extracted_texts(path: str) -> list[str]:
    from data_pipeline.extract.html import extract
    from data_pipeline.readers import read

    recipe = Recipe()
    texts = []
    for doc in read(path, recipe.reader, Stats()):
        if extract(doc, recipe.extract) is None:
            texts.append(doc.text)
    return texts


def datatrove_steps(c4_words: int, c4_sentences: int):
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    return {
        "gopher_repetition": GopherRepetitionFilter(),
        "gopher_quality": GopherQualityFilter(),
        "c4": C4QualityFilter(min_words_per_line=c4_words, min_num_sentences=c4_sentences),
        "fineweb": FineWebQualityFilter(),
    }


def datatrove_run(path: str, c4_words: int, c4_sentences: int) -> tuple[float, int]:
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader

    reader = WarcReader(os.path.dirname(path), glob_pattern=os.path.basename(path))
    chain = [reader, Trafilatura(favour_precision=True, timeout=5.0), *datatrove_steps(c4_words, c4_sentences).values()]
    start = time.perf_counter()
    data = None
    for step in chain:
        data = step(data, rank=0, world_size=1)
    kept = sum(1 for _ in data)
    return time.perf_counter() - start, kept


def agreement(texts: list[str]) -> dict[str, tuple[int, int, list[str]]]:
    from datatrove.data import Document as DTDoc

    from data_pipeline.filters import quality

    r = Recipe()
    ours_rules = {
        "gopher_repetition": lambda t: quality.gopher_repetition(t, r.gopher_repetition)[0],
        "gopher_quality": lambda t: quality.gopher_quality(t, r.gopher_quality)[0],
        "c4": lambda t: quality.c4(t, r.c4)[0],
        "fineweb": lambda t: quality.fineweb(t, r.fineweb)[0],
    }
    theirs = datatrove_steps(r.c4.min_words_per_line, r.c4.min_sentences)
    out = {}
    for name, fn in ours_rules.items():
        same, disagree = 0, []
        for i, text in enumerate(texts):
            mine = fn(text) is None
            verdict = theirs[name].filter(DTDoc(text=text, id=str(i)))
            their = verdict if isinstance(verdict, bool) else verdict[0]
            same += mine == their
            if mine != their and len(disagree) < 3:
                disagree.append(
                    f"doc {i}: ours {'keep' if mine else fn(text)}, datatrove {'keep' if their else verdict[1]}"
                )
        out[name] = (same, len(texts), disagree)
    return out


def minhash_rates(texts: list[str], rounds: int = 3) -> tuple[float, float]:
    """Seconds for all signatures, ours and datasketch's: the best of ``rounds`` alternating runs
    (this machine's timings are noisy)."""
    from datasketch import MinHash

    from data_pipeline.dedup.hashing import normalize
    from data_pipeline.dedup.minhash import MinHasher

    hasher = MinHasher(bands=14, rows=8, ngram=5)

    def mine() -> None:
        for t in texts:
            hasher.signature(t)

    def theirs() -> None:
        for t in texts:
            words = normalize(t, "minhash").split()
            m = MinHash(num_perm=112)
            m.update_batch([b" ".join(words[i : i + 5]) for i in range(max(1, len(words) - 4))])

    best = {mine: float("inf"), theirs: float("inf")}
    for _ in range(rounds):
        for fn in best:
            start = time.perf_counter()
            fn()
            best[fn] = min(best[fn], time.perf_counter() - start)
    return best[mine], best[theirs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pydoc.warc.gz")
        n, size = pydoc_warc(path, args.pages)
        print(f"input: {n} pydoc HTML pages, {size / 1e6:.1f} MB of HTML, one process\n")
        t_ours, kept_ours, _ = ours(path, language=True)
        t_ours_nolang, _, _ = ours(path, language=False)
        try:
            t_dt, kept_dt = datatrove_run(path, Recipe().c4.min_words_per_line, Recipe().c4.min_sentences)
        except ImportError as err:
            sys.exit(f"datatrove is not installed ({err}); pip install -e .[bench]")
        rows = [
            ("glm-dist: read+extract+langid+4 rule sets", t_ours, kept_ours),
            ("glm-dist: same, without language ID", t_ours_nolang, None),
            ("datatrove: read+trafilatura+4 rule sets (no langid)", t_dt, kept_dt),
        ]
        print("| pipeline | docs/s | MB/s | kept | vs datatrove |\n|---|---:|---:|---:|---:|")
        for name, t, kept in rows:
            print(
                f"| {name} | {n / t:.1f} | {size / 1e6 / t:.2f} | {kept if kept is not None else '-'} | "
                f"{t_dt / t:.1f}x |"
            )
        texts = extracted_texts(path)
        print(f"\nrule agreement on the same {len(texts)} extracted texts (ours vs datatrove, same thresholds):\n")
        print("| rule set | same decision | share |\n|---|---:|---:|")
        notes = []
        for name, (same, total, disagree) in agreement(texts).items():
            print(f"| {name} | {same}/{total} | {same / total:.1%} |")
            notes += [f"  {name}: {d}" for d in disagree]
        if notes:
            print("\nfirst disagreements:\n" + "\n".join(notes))
        mine, theirs = minhash_rates(texts)
        mb = sum(len(t.encode()) for t in texts) / 1e6
        print("\n| MinHash, 112 permutations | docs/s | MB/s | speed-up |\n|---|---:|---:|---:|")
        print(
            f"| glm-dist (numpy, vectorised hashing) | {len(texts) / mine:.0f} | {mb / mine:.2f} | "
            f"{theirs / mine:.1f}x |"
        )
        print(f"| datasketch MinHash.update_batch | {len(texts) / theirs:.0f} | {mb / theirs:.2f} | 1.0x |")


if __name__ == "__main__":
    main()
