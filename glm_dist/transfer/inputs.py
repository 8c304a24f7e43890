"""Task inputs as batches: the padding and slicing every ``glm finetune`` task kind shares (``pad_ids``,
``batch_rows``, ``batch_on``), and GPT's task input transformations (Radford et al. 2018, section 3.3 and
figure 1).

Every input is one or more token sequences wrapped in a start token and an extract token, all
three special tokens new to the pretrained vocabulary (their embeddings are learned during
fine-tuning, ``GPT.add_tokens``):

- classification: ``<s> text <e>``
- entailment: ``<s> premise $ hypothesis <e>``
- similarity: both orders, ``<s> a $ b <e>`` and ``<s> b $ a <e>`` (their final states are summed)
- multiple choice: ``<s> context $ answer_k <e>`` for every candidate k (softmax over candidates)

An example is a list of sequences; ``pack`` pads a batch of examples to (B, S, T) tensors with the
extract position of each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

KINDS = ("classify", "entailment", "similarity", "multiple_choice")


def pad_ids(seqs: Sequence[Sequence[int]], pad_id: int, *, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Id sequences -> ``ids`` and ``mask``, both (B, T) long, T the longest: padded with ``pad_id`` on the
    right, or on the left (XLNet reads its last position); ``mask`` is 1 at the sequences' own tokens (the
    attention mask; ``mask.sum(-1)`` their lengths)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, seq in enumerate(seqs):
        at = width - len(seq) if left else 0
        ids[i, at : at + len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, at : at + len(seq)] = 1
    return ids, mask


def batch_rows(n: int, batch_size: int) -> list[slice]:
    """Rows ``0 .. n - 1`` in order, as slices of ``batch_size`` (the last may be shorter): how held-out
    scores and features read their data."""
    return [slice(i, i + batch_size) for i in range(0, n, batch_size)]


def batch_on(
    data: dict[str, torch.Tensor], device: torch.device | str, rows: slice | list[int] = slice(None)
) -> dict[str, torch.Tensor]:
    """``rows`` of every tensor of ``data`` (all of them by default), on ``device``."""
    return {k: v[rows].to(device) for k, v in data.items()}


@dataclass(frozen=True)
class SpecialTokens:
    start: int
    delimiter: int  # the paper's "$"
    extract: int

    @classmethod
    def after(cls, vocab_size: int) -> SpecialTokens:
        """The three ids appended after a vocabulary of ``vocab_size``."""
        return cls(vocab_size, vocab_size + 1, vocab_size + 2)


def _fit(a: list[int], b: list[int], room: int) -> tuple[list[int], list[int]]:
    """Cut the longer of two segments first until both fit in ``room`` tokens (the end of ``a``
    and the start of ``b`` are kept: they meet at the delimiter)."""
    while len(a) + len(b) > room:
        if len(a) >= len(b):
            a = a[1:]
        else:
            b = b[:-1]
    return a, b


def classification(text: list[int], sp: SpecialTokens, max_len: int) -> list[list[int]]:
    return [[sp.start, *text[: max_len - 2], sp.extract]]


def entailment(premise: list[int], hypothesis: list[int], sp: SpecialTokens, max_len: int) -> list[list[int]]:
    p, h = _fit(premise, hypothesis, max_len - 3)
    return [[sp.start, *p, sp.delimiter, *h, sp.extract]]


def similarity(a: list[int], b: list[int], sp: SpecialTokens, max_len: int) -> list[list[int]]:
    """Both orders: there is no inherent order between two sentences being compared."""
    return entailment(a, b, sp, max_len) + entailment(b, a, sp, max_len)


def multiple_choice(context: list[int], answers: list[list[int]], sp: SpecialTokens, max_len: int) -> list[list[int]]:
    return [entailment(context, answer, sp, max_len)[0] for answer in answers]


def transform(kind: str, first: list[int], second, sp: SpecialTokens, max_len: int) -> list[list[int]]:
    """One example's sequences: ``second`` is None (classify), a token list (entailment,
    similarity) or a list of token lists (multiple choice)."""
    if kind == "classify":
        return classification(first, sp, max_len)
    if kind == "multiple_choice":
        return multiple_choice(first, second, sp, max_len)
    return (similarity if kind == "similarity" else entailment)(first, second, sp, max_len)


def pack(examples: list[list[list[int]]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Examples of S_i sequences -> ``input_ids`` (B, S, T) right-padded, ``extract`` (B, S) the
    position of each sequence's extract token, ``lengths`` (B, S) and ``choice_mask`` (B, S),
    False for the filler sequences of an example with fewer than S (its candidates get -inf)."""
    B, S = len(examples), max(len(e) for e in examples)
    # an example's filler sequences are one padding token each (length 1, extract 0)
    ids, mask = pad_ids([seq for e in examples for seq in e + [[pad_id]] * (S - len(e))], pad_id)
    lengths = mask.sum(-1).view(B, S)
    choices = torch.tensor([[s < len(e) for s in range(S)] for e in examples])
    return {"input_ids": ids.view(B, S, -1), "extract": lengths - 1, "lengths": lengths, "choice_mask": choices}
