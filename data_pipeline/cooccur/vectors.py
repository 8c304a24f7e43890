"""Word vectors in GloVe's text format: one line per word, ``word v1 v2 ... vd`` (space separated).

The format of the published glove.*.txt files, which CoVe and most tools read. Reading is bounded:
a line longer than ``MAX_LINE_BYTES`` or a file beyond ``max_words`` stops with an error, and a
line whose width differs from the first is refused with its number.
"""

from __future__ import annotations

from typing import Sequence

import fsspec
import numpy as np

from data_pipeline.errors import PipelineError
from data_pipeline.remote import open_url

MAX_LINE_BYTES = 1 << 20  # 300 floats take ~3 KB


def write_text(path: str, words: Sequence[str], vectors: np.ndarray) -> int:
    """Write ``vectors`` (V, d) for ``words`` (V,) -- a word with whitespace in it is skipped, the
    format cannot hold it. Returns the number of lines written."""
    if len(words) != len(vectors):
        raise ValueError(f"{len(words)} words but {len(vectors)} vectors")
    lines = 0
    with open_url(path + ".tmp", "w", encoding="utf-8") as f:
        for word, vec in zip(words, vectors):
            if not word or any(c.isspace() for c in word):
                continue
            f.write(word + " " + " ".join(f"{v:.6g}" for v in vec) + "\n")
            lines += 1
    fs, local = fsspec.core.url_to_fs(path)
    fs.mv(local + ".tmp", local)
    return lines


def read_text(path: str, *, max_words: int = 5_000_000) -> tuple[list[str], np.ndarray]:
    """(words, (V, d) float32 vectors) of a GloVe text file."""
    words, rows = [], []
    with open_url(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise PipelineError(f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes: not a GloVe text file")
            if number > max_words:
                raise PipelineError(f"{path}: more than {max_words} words")
            word, *values = line.decode("utf-8").rstrip("\n").split(" ")
            if rows and len(values) != len(rows[0]):
                raise PipelineError(f"{path}:{number}: {len(values)} values, the first line has {len(rows[0])}")
            try:
                rows.append(np.asarray(values, dtype=np.float32))
            except ValueError:
                raise PipelineError(f"{path}:{number}: a value is not a number") from None
            words.append(word)
    return words, np.stack(rows) if rows else np.zeros((0, 0), np.float32)
