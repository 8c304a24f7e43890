"""GPT's task input transformations (Radford et al. 2018, section 3.3 and figure 1).

Every input is one or more token sequences wrapped in a start token and an extract token, all
three special tokens new to the pretrained vocabulary (their embeddings are learned during
fine-tuning, ``heads.add_token_embeddings``):

- classification: ``<s> text <e>``
- entailment: ``<s> premise $ hypothesis <e>``
- similarity: both orders, ``<s> a $ b <e>`` and ``<s> b $ a <e>`` (their final states are summed)
- multiple choice: ``<s> context $ answer_k <e>`` for every candidate k (softmax over candidates)

An example is a list of sequences; ``pack`` pads a batch of examples to (B, S, T) tensors with the
extract position of each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KINDS = ("classify", "entailment", "similarity", "multiple_choice")


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
    S = max(len(e) for e in examples)
    T = max(len(s) for e in examples for s in e)
    ids = torch.full((len(examples), S, T), pad_id, dtype=torch.long)
    lengths = torch.ones(len(examples), S, dtype=torch.long)
    for b, example in enumerate(examples):
        for s, seq in enumerate(example):
            ids[b, s, : len(seq)] = torch.tensor(seq)
            lengths[b, s] = len(seq)
    mask = torch.tensor([[s < len(e) for s in range(S)] for e in examples])
    return {"input_ids": ids, "extract": lengths - 1, "lengths": lengths, "choice_mask": mask}
