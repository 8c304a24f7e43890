"""A checkpoint's contextual features for raw texts (``glm features``): the family's own ``features``
function (its registry row: ELMo's biLM layers) applied to each text, saved as ``.npz`` -- arrays
``"0"``, ``"1"``, ... in text order, each (layers, words, width) for ELMo."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import fsspec
import numpy as np

from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.errors import GlmError
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.registry import family, resolve
from glm_dist.transfer.files import read_rows

MAX_INPUT_BYTES = 256 * 2**20


def read_texts(path: str, *, text_field: str = "text") -> list[str]:
    """The texts of a JSONL file (``.jsonl`` / ``.json``, optionally compressed: each row's ``text_field``)
    or of a text file (one text per non-empty line)."""
    if ".json" in Path(path).name:
        rows = read_rows(path)
        missing = next((n for n, r in enumerate(rows, 1) if not isinstance(r.get(text_field), str)), None)
        if missing is not None:
            raise GlmError(f"{path}: row {missing} has no text field {text_field!r} (set --text-field)")
        return [r[text_field] for r in rows]
    with fsspec.open(path, "rb", compression="infer") as f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise GlmError(f"{path} is larger than {MAX_INPUT_BYTES >> 20} MiB: split it")
    try:
        return [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as err:
        raise GlmError(f"{path}: not UTF-8 text ({err})") from None


def export_features(
    checkpoint: str | Path, texts: Sequence[str], *, out: str | Path | None = None, batch_size: int = 32
) -> list[np.ndarray]:
    """Each text's features as float32 arrays; with ``out`` also saved as ``.npz``."""
    if not texts:
        raise GlmError("no texts to compute features of")
    model, meta = load_checkpoint_model(checkpoint)
    ref = family(meta["model_family"]).features
    if ref is None:
        raise GlmError(
            f"checkpoint {checkpoint} is a {meta['model_family']} model, which exports no contextual "
            f"features (families with a features function in glm_dist/families/registry.py do)"
        )
    tok = checkpoint_tokenizer(checkpoint)
    features = resolve(ref)(model, tok, list(texts), batch_size=batch_size)
    if out is not None:
        np.savez(out, **{str(i): f for i, f in enumerate(features)})
    return features
