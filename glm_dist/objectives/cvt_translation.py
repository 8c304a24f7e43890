"""Cross-View Training for translation (Clark et al. 2018, section 3.3) on the CoVe model built with
``cvt_decoders: true``: labelled pairs and unlabelled source sentences in turn.

The shard set is a pair set built with ``data.labelled_pairs=N`` (data_pipeline/tokenize/pairs.py):
N training pairs keep their targets (split ``train``), the other training pairs keep only their
sources (split ``unlabelled``). The alternating loader (glm_dist/data/alternating.py) deals whole
minibatches from one split at a time; ``objective.cvt_unlabelled=false`` is the supervised baseline
on the same labelled pairs.

- Labelled minibatch: the primary decoder's teacher-forced NLL (the ``translation`` objective's).
- Unlabelled minibatch: the primary model, dropout off and without gradients, translates the
  sources with beam search (``model.cvt_beam``; 1: greedy); its best hypothesis is a hard target
  for both auxiliary decoders, teacher-forced on it with dropout on: the attention-dropout view
  scores y_t at t, the future view scores y_{t+1} at t. The loss is the sum of their mean token
  NLLs. Gradients reach the auxiliary decoders, the shared target embedding and decoder LSTMs and
  the encoder, never the primary's attention or softmax (they are not in the graph).

The teacher's decoding synchronises with the host at every generated token (beam search's choice is
data-dependent), once per unlabelled minibatch; the labelled steps have no host sync.
Evaluation is the primary model's: held-out NLL, perplexity and BLEU, as ``translation``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from data_pipeline.tokenize.pairs import TARGET
from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.models.generate import GenerationConfig, generate
from glm_dist.objectives.base import IGNORE_INDEX, seq2seq_loss
from glm_dist.objectives.cvt import CrossViewOptions
from glm_dist.objectives.translation import Translation

VIEWS = {"attention_dropout": 0, "future": 1}  # view -> how many tokens past the primary's it scores


def word_specials() -> tuple[int, int]:
    """(<bos>, <eos>): a pair set's tokenizers are ``word`` profile ones whose special tokens come
    first, in the profile's order, on both sides (data_pipeline/tokenize/pairs.py checks it)."""
    specials = PROFILES["word"].specials
    return specials.index("<bos>"), specials.index("<eos>")


def teacher_targets(seq: torch.Tensor, eos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(decoder inputs, labels) from decoded rows ``<bos> y_1 ... <eos> <eos> ...``: inputs drop the
    last column, labels the first, every label after a row's first ``<eos>`` is -100."""
    inputs, labels = seq[:, :-1], seq[:, 1:]
    ended = (labels == eos).long()
    after = (ended.cumsum(1) - ended) > 0  # strictly after the first <eos>
    return inputs, labels.masked_fill(after, IGNORE_INDEX)


def view_loss(logits: torch.Tensor, labels: torch.Tensor, ahead: int) -> torch.Tensor:
    """Mean NLL of ``labels`` shifted ``ahead`` tokens under (B, T, V) logits (no host sync)."""
    if ahead:
        logits, labels = logits[:, :-ahead], labels[:, ahead:]
    nll = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
    return nll / (labels != IGNORE_INDEX).sum().clamp(min=1)


class CrossViewTranslation(Translation):
    loader = "glm_dist.data.alternating:AlternatingLoader"  # labelled pairs and unlabelled sources in turn
    Options = CrossViewOptions

    def refuse_model(self, model_cfg):
        """``model_cfg`` is a CoVe config (the only family this objective trains, checked first)."""
        if not model_cfg.cvt_decoders:
            return "the model has no auxiliary decoders: set model.cvt_decoders=true"
        if model_cfg.cvt_beam < 1 or not 0 <= model_cfg.cvt_attention_dropout < 1:
            return (
                f"model.cvt_beam={model_cfg.cvt_beam} must be >= 1 and model.cvt_attention_dropout="
                f"{model_cfg.cvt_attention_dropout} in [0, 1)"
            )
        return None

    def sample(self, unit, rng, *, vocab, opts):
        pair, limit = unit
        if (pair["side"] == TARGET).any():
            return super().sample(unit, rng, vocab=vocab, opts=opts)
        return {"input_ids": pair["token"][:limit].astype(np.int64)}  # an unlabelled source

    def loss(self, model, batch, *, metrics):
        if "labels" in batch:
            return seq2seq_loss(model, batch, metrics=metrics)
        return self._consistency(model, batch), {}

    def _consistency(self, model, batch) -> torch.Tensor:
        net = getattr(model, "module", model)  # the DeepSpeed engine's model: its encode / decode
        cfg, (bos, eos) = net.cfg, word_specials()
        source, mask = batch["input_ids"], batch.get("attention_mask")
        decoding = GenerationConfig(
            max_new_tokens=source.shape[1],
            strategy="beam" if cfg.cvt_beam > 1 else "greedy",
            num_beams=max(cfg.cvt_beam, 1),
            eos_id=eos,
        )
        was_training = net.training
        net.eval()
        try:
            with torch.no_grad():
                seq = generate(net, source, decoding, attention_mask=mask, start_id=bos)
        finally:
            net.train(was_training)
        inputs, labels = teacher_targets(seq, eos)
        views = model(source, inputs, attention_mask=mask, mode="student")["auxiliary"]
        return sum(view_loss(views[name], labels, ahead) for name, ahead in VIEWS.items())


CVT_TRANSLATION = CrossViewTranslation(name="cvt_translation", salt=1060)
