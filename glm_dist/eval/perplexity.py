"""Validation loss, perplexity and bits per byte.

Bits per byte = total NLL (nats) / (ln 2 x UTF-8 bytes of the predicted tokens), which compares
across tokenizers; special tokens count zero bytes. Whole documents longer than the context are
scored in sliding windows with a stride (``document_perplexity``), reported per token, per word
and per byte.
"""

from __future__ import annotations

import math
import re
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.vocab_tables import token_byte_lengths
from glm_dist.families.registry import family
from glm_dist.objectives.base import Objective, to_device
from glm_dist.parallel import comm


def byte_length_table(tok: Tokenizer, vocab_size: int) -> torch.Tensor:
    """Bytes per token id, padded with zeros to the model's (possibly larger) vocabulary."""
    lengths = token_byte_lengths(tok)
    return torch.from_numpy(np.pad(lengths, (0, vocab_size - len(lengths))))


@torch.no_grad()
def evaluate(
    forward: Callable,
    batches: list[tuple[dict, float]],
    *,
    byte_lengths: torch.Tensor,
    objective: Objective,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """``batches``: (batch, weight) pairs from ``validation_batches``; sums over all ranks, then the
    objective's report (CLM: loss, perplexity, bits per byte; MLM-style: loss and perplexity over
    the masked tokens, accuracy, the sentence task's loss and accuracy, ELECTRA's replaced-token
    detection accuracy)."""
    totals = dict.fromkeys(objective.sums, 0.0)
    for batch, weight in batches:
        _, sums = objective.loss(forward, to_device(batch, device), metrics=True)
        sums.pop("mems", None)  # validation segments are scored without a memory
        labels = sums.pop("labels", None)
        if labels is not None:  # bits per byte: the UTF-8 bytes the predicted tokens stand for
            sums["bytes"] = byte_lengths[labels.cpu()].sum().item()
        for key, value in sums.items():
            totals[key] += weight * value
    totals = dict(zip(totals, comm.all_reduce_values(list(totals.values()))))
    return objective.report(totals)


def evaluate_sources(
    run: Callable[[list], dict],
    batches: list[tuple[dict, float]],
    *,
    names: tuple[str, ...],
    weights: tuple[float, ...],
) -> dict[str, float]:
    """A data mixture's validation: ``run`` (batches -> the objective's report) over each source's own
    validation batches (``validation_batches`` of a mixture: every batch one source's, its rows tagged
    ``source``), each metric per source as ``<metric>/<source>``, and the mixture's figure under the
    plain names (``mixture_report``). Every rank runs the same sources in the same order."""
    groups: list[list] = [[] for _ in names]
    for batch, weight in batches:
        groups[int(batch["source"][0])].append((batch, weight))
    per_source = {name: run(group) for name, group in zip(names, groups)}
    return {
        **mixture_report(list(per_source.values()), weights),
        **{f"{k}/{name}": v for name, report in per_source.items() for k, v in report.items()},
    }


def mixture_report(reports: list[dict[str, float]], weights: tuple[float, ...]) -> dict[str, float]:
    """The mixture's validation figure from its sources' reports: the mean over a token drawn as the
    run draws them -- each source's per-token metrics weighted by its mixture weight (the share of
    the training tokens it gives), so loss = sum_s w_s loss_s, perplexity = exp(loss), bits per byte
    = sum_s w_s nll_s / (ln 2 sum_s w_s bytes_s), both per token (a harmonic mean of the sources'),
    and ``tokens`` the sum. Not the pooled mean over the validation sets: their sizes (data.eval_batches
    each, or a smaller held-out split) say nothing about the mixture, and a pooled figure would move
    with them. The sources' own figures stand beside it, as Pythia (per Pile subset) and OLMo (per
    Paloma domain) report theirs; this one is the train loss's validation counterpart."""
    out = {}
    for key in reports[0]:
        values = [r[key] for r in reports]
        if key == "tokens":
            out[key] = sum(values)
        elif key == "bits_per_byte":  # bytes per token of source s: loss_s / (ln 2 bpb_s)
            per_byte = sum(w * r["loss"] / r[key] for w, r in zip(weights, reports) if r[key])  # ln 2 x bytes/token
            out[key] = sum(w * r["loss"] for w, r in zip(weights, reports)) / per_byte if per_byte else 0.0
        elif key != "perplexity":
            out[key] = sum(w * v for w, v in zip(weights, values))
    if "perplexity" in reports[0]:
        out["perplexity"] = math.exp(min(out["loss"], 50))
    return out


def sliding_windows(num_tokens: int, *, context: int, stride: int) -> list[tuple[int, int, int]]:
    """Windows over ``x = [prefix] + tokens`` for documents longer than the context (GPT-2's LM
    benchmarks; lm-eval's ``loglikelihood_rolling``): each ``(start, end, scored)`` reads
    ``x[start:end]`` and its last ``scored`` positions predict ``x[end - scored + 1 : end + 1]``. The
    first window scores all it reads; each later one reads ``context`` tokens and scores the
    ``stride`` after the previous window's, so every token is scored exactly once, with at least
    ``context - stride`` tokens before it (stride = context: disjoint windows)."""
    if not 1 <= stride <= context:
        raise ValueError(f"stride={stride} must be between 1 and the context length {context}")
    if num_tokens == 0:
        return []
    done = min(context, num_tokens)
    windows = [(0, done, done)]
    while done < num_tokens:
        end = min(done + stride, num_tokens)
        windows.append((end - context, end, end - done))
        done = end
    return windows


@torch.no_grad()
def document_nll(
    model: Callable,
    tokens,
    *,
    prefix_id: int,
    context: int,
    stride: int,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
) -> float:
    """A document's negative log-likelihood (nats) in sliding windows, from ``prefix_id`` on."""
    x = torch.tensor([prefix_id, *[int(t) for t in tokens]])
    spans = sliding_windows(len(x) - 1, context=context, stride=stride)
    total = 0.0
    for i in range(0, len(spans), batch_size):
        part = spans[i : i + batch_size]
        batch = torch.zeros(len(part), max(b - a for a, b, _ in part), dtype=torch.long)
        for row, (a, b, _) in zip(batch, part):
            row[: b - a] = x[a:b]  # right padding: causal, so no scored position sees it
        logprobs = torch.log_softmax(model(batch.to(device)).float(), dim=-1)  # (B, T, V)
        for lp, (a, b, k) in zip(logprobs, part):
            total -= lp[b - a - k : b - a].gather(-1, x[b - k + 1 : b + 1, None].to(lp.device)).sum().item()
    return total


def document_perplexity(
    model: Callable,
    documents: list,
    tok: Tokenizer,
    *,
    prefix_id: int,
    context: int,
    stride: int,
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Whole documents scored in sliding windows: token-level, word-level and per-byte perplexity
    and bits per byte side by side (words and bytes of the decoded text, counted as lm-eval's
    rolling tasks count them), so models with different tokenizers compare."""
    nll = tokens = words = n_bytes = 0
    for doc in documents:
        text = tok.decode([int(t) for t in doc], skip_special_tokens=False)
        nll += document_nll(model, doc, prefix_id=prefix_id, context=context, stride=stride, device=device)
        tokens, words, n_bytes = tokens + len(doc), words + len(re.split(r"\s+", text)), n_bytes + len(text.encode())
    return {
        "documents": len(documents),
        "stride": stride,
        "context": context,
        "tokens": tokens,
        "words": words,
        "bytes": n_bytes,
        "nll": nll,
        "token_perplexity": math.exp(nll / tokens),
        "word_perplexity": math.exp(nll / words),
        "byte_perplexity": math.exp(nll / n_bytes),
        "bits_per_byte": nll / (n_bytes * math.log(2)),
    }


@torch.no_grad()
def gives_next_token_logits(family_name: str) -> bool:
    """Whether the family is a decoder-only LM: its forward maps token ids (B, T) to logits (B, T, V)
    (its registry row says so; calling the model to find out needs inputs some families lack)."""
    return family(family_name).next_token_logits
