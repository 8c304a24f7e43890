"""Held-out BLEU of the translation objectives (``checkpoint_metrics``): translation with an
encoder-decoder over a pair set's two vocabularies.

Sentences are tokenized with the pair set's source tokenizer (cut to ``max_len`` tokens), decoded
by glm_dist/models/generate.py (greedy or beam search, from ``<bos>`` to ``<eos>``) and spelled with
the target vocabulary, words joined by spaces. BLEU is sacrebleu's corpus BLEU against the raw
references with its 13a tokenizer, lower-cased (the word vocabularies are lower case).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from data_pipeline.tokenize.word import vocabulary
from glm_dist.errors import GlmError
from glm_dist.models.generate import GenerationConfig, generate

MAX_FILE_BYTES = 256 * 2**20


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise GlmError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return data.decode("utf-8")


def pair_tokenizers(shards_dir: str):
    """(source tokenizer, target tokenizer, manifest) of a pair set."""
    from tokenizers import Tokenizer

    root = Path(shards_dir)
    manifest = json.loads(_read(root / "manifest.json"))
    if "target_tokenizer" not in manifest:
        raise GlmError(f"{shards_dir} is not a translation pair set (its manifest names no target tokenizer)")
    return (
        Tokenizer.from_str(_read(root / manifest["tokenizer"]["file"])),
        Tokenizer.from_str(_read(root / manifest["target_tokenizer"]["file"])),
        manifest,
    )


@torch.no_grad()
def translate(
    model,
    src_tok,
    tgt_tok,
    sentences: Sequence[str],
    cfg: GenerationConfig,
    *,
    max_len: int,
    batch_size: int = 64,
    device="cpu",
) -> list[str]:
    """Each sentence's translation (target words joined by spaces)."""
    bos, eos, pad = (src_tok.token_to_id(t) for t in ("<bos>", "<eos>", "<pad>"))
    words = vocabulary(tgt_tok)
    specials = {tgt_tok.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>")}
    cfg = replace(cfg, eos_id=eos)
    model = model.to(device).eval()
    out = []
    for start in range(0, len(sentences), batch_size):
        ids = [
            src_tok.encode(s).ids[:max_len] or [src_tok.token_to_id("<unk>")]
            for s in sentences[start : start + batch_size]
        ]
        width = max(len(i) for i in ids)
        input_ids = torch.tensor([i + [pad] * (width - len(i)) for i in ids], device=device)
        mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids], device=device)
        for row in generate(model, input_ids, cfg, attention_mask=mask, start_id=bos)[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            out.append(" ".join(words[t] for t in row if t not in specials))
    return out


def held_out_bleu(model, shards_dir: str, *, num_pairs: int, max_len: int, device="cpu", num_beams: int = 4) -> dict:
    """BLEU of greedy and beam-search translations of the pair set's first ``num_pairs`` held-out pairs."""
    import sacrebleu

    src_tok, tgt_tok, manifest = pair_tokenizers(shards_dir)
    rows = [json.loads(line) for line in _read(Path(shards_dir) / manifest["references"]).splitlines()][:num_pairs]
    if not rows:
        raise GlmError(f"{shards_dir} holds no held-out pairs to score")
    sources, refs = [r["source"] for r in rows], [r["target"] for r in rows]
    result = {"bleu_pairs": len(rows)}
    for name, cfg in (
        ("greedy", GenerationConfig(max_new_tokens=max_len)),
        ("beam", GenerationConfig(max_new_tokens=max_len, strategy="beam", num_beams=num_beams)),
    ):
        hyps = translate(model, src_tok, tgt_tok, sources, cfg, max_len=max_len, device=device)
        bleu = sacrebleu.corpus_bleu(hyps, [refs], lowercase=True)
        result[f"bleu_{name}"] = round(bleu.score, 2)
        if name == "greedy":
            result["examples"] = [
                {"source": s, "reference": r, "greedy": h} for s, r, h in zip(sources[:3], refs, hyps)
            ]
    return result
