"""ELMo's bidirectional LM (Peters et al. 2018): the forward LM predicts each next token, the backward
LM each previous one; the loss is the sum of the two directions' mean NLL.

Documents are marked ``<bos> ... <eos>`` and packed into windows of ``seq_len + 2`` tokens every
``seq_len`` (``TokenPacker``: exact resume). The inputs are the window's middle ``seq_len`` tokens,
so every input has both a next token (forward target) and a previous one (backward target), and
every token of the stream is a forward and a backward target once. With a word-level tokenizer
(its manifest lists the ``words``) samples also carry ``char_ids`` (seq_len, 50): each token spelled
for the character CNN, from a table computed here at load time (data_pipeline/tokenize/word.py).
Evaluation reports both directions' perplexity and their mean (the paper's figure).
"""

from __future__ import annotations

import math

import numpy as np

from data_pipeline.tokenize.word import char_table
from glm_dist.objectives.base import IGNORE_INDEX, Objective
from glm_dist.objectives.clm import TokenPacker
from glm_dist.ops.cross_entropy import cross_entropy


class MarkedWindows:
    """``<bos> doc <eos>`` packed into (seq_len + 2)-token windows."""

    def __init__(self, seq_len: int, *, bos: int, eos: int):
        self.packer, self.bos = TokenPacker(seq_len + 2, stride=seq_len, sep=eos), bos

    def units(self, docs, rng_for=None):
        marked = (d._replace(tokens=np.concatenate([[self.bos], d.tokens.astype(np.int64)])) for d in docs)
        return self.packer.blocks(marked)

    def state_dict(self) -> dict:
        return self.packer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.packer.load_state_dict(state)


_TABLE: dict = {}  # the last vocabulary's words and their character table (one per process)


def chars_of(vocab) -> np.ndarray | None:
    """(V, 50) character ids of every token id, when the tokenizer lists its words (else None);
    computed once per vocabulary and process."""
    words = vocab.ids.get("words")
    if words is None:
        return None
    if _TABLE.get("words") is not words:
        _TABLE.update(
            words=words,
            table=char_table(words, pad=vocab.ids.get("pad"), bos=vocab.ids.get("bos"), eos=vocab.ids.get("eos")),
        )
    return _TABLE["table"]


def direction_nll(logits, labels):
    """Summed fp32 cross-entropy of one direction's (B, T, V) logits against (B, T) labels (inside
    ``row_groups`` also summed per source: a data mixture's per-source train loss)."""
    return cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")


class BidirectionalLM(Objective):
    def builder(self, *, seq_len, vocab, opts, stream=0):
        return MarkedWindows(seq_len, bos=vocab.id("bos"), eos=vocab.id("eos"))

    def sample(self, unit, rng, *, vocab, opts):
        window, chars = np.asarray(unit), chars_of(vocab)
        out = {"input_ids": window[1:-1], "forward_labels": window[2:], "backward_labels": window[:-2]}
        if chars is not None:
            out["char_ids"] = chars[window[1:-1]]
        return out

    def loss(self, model, batch, *, metrics):
        out = model(batch["input_ids"], char_ids=batch.get("char_ids"), attention_mask=batch.get("attention_mask"))
        forward = direction_nll(out["forward_logits"], batch["forward_labels"])
        backward = direction_nll(out["backward_logits"], batch["backward_labels"])
        targets = (batch["forward_labels"] != IGNORE_INDEX).sum()
        loss = (forward + backward) / targets.clamp(min=1)
        if not metrics:
            return loss, {}
        return loss, {"nll_forward": forward.item(), "nll_backward": backward.item(), "targets": int(targets)}

    def report(self, totals):
        """``loss``: forward + backward mean NLL (the training loss); ``perplexity``: the mean of the
        two directions' perplexities."""
        n = max(totals["targets"], 1)
        forward, backward = totals["nll_forward"] / n, totals["nll_backward"] / n
        ppl = [math.exp(min(forward, 50)), math.exp(min(backward, 50))]
        return {
            "loss": forward + backward,
            "perplexity": sum(ppl) / 2,
            "forward_perplexity": ppl[0],
            "backward_perplexity": ppl[1],
            "forward_loss": forward,
            "backward_loss": backward,
            "tokens": int(n),
        }


BILM = BidirectionalLM(name="bilm", salt=1021, sums=("nll_forward", "nll_backward", "targets"))
