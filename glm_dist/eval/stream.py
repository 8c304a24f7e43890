"""Token-by-token decoding: ``glm generate`` and the harness's ``generate_until``.

Greedy and sampling yield each token as soon as it is chosen (beam search knows its answer only at
the end: ``generate.generate``), with the same key/value cache, choice rule and sampling filters as
``generate.generate``. Decoder-only models continue the prompt; encoder-decoders (T5, BART) read it
with the encoder and decode from their start token.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Iterator, TextIO

import torch
from tokenizers import Tokenizer

from data_pipeline.tokenize.profiles import special_ids
from glm_dist.checkpoint.consolidate import checkpoint_tokenizer
from glm_dist.errors import GlmError
from glm_dist.eval.run import load_checkpoint_model
from glm_dist.families.registry import FAMILIES, exported_module, family
from glm_dist.models.generate import Decoder, GenerationConfig, filter_logits, generate


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    eos_id: int  # end of text (decoder-only) or of the output (encoder-decoder)
    start_id: int | None  # an encoder-decoder's first decoder token


def generates(spec) -> bool:
    """A family ``Decoder`` continues: a decoder-only LM or an encoder-decoder."""
    return spec.next_token_logits or spec.decoder_start is not None


def load_decoder(checkpoint: str) -> LoadedModel:
    """A checkpoint's model (eval mode, on the GPU when there is one), tokenizer and special ids."""

    model, meta = load_checkpoint_model(checkpoint)
    spec = family(meta["model_family"])
    if not generates(spec):
        able = ", ".join(n for n, s in FAMILIES.items() if generates(s))
        raise GlmError(
            f"checkpoint {checkpoint} is a {meta['model_family']} model, which does not generate text "
            f"(decoder-only and encoder-decoder families do: {able})"
        )
    tok = checkpoint_tokenizer(checkpoint)
    ids = special_ids(tok, meta["config"]["data"]["tokenizer_profile"])
    eos = ids.get("eot", ids.get("eos"))
    if eos is None:
        raise GlmError(f"{checkpoint}: its tokenizer has no end-of-text token")
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = exported_module(meta["model_family"], model).to(device).eval()
    return LoadedModel(model, tok, eos, ids[spec.decoder_start] if spec.decoder_start else None)


@torch.no_grad()
def stream_tokens(model, prompt: list[int], cfg: GenerationConfig, *, start_id: int | None = None) -> Iterator[int]:
    """The continuation of one prompt (the output, for an encoder-decoder), a token at a time;
    stops after EOS (yielded), ``max_new_tokens`` or the end of the decoder's context."""
    device = next(model.parameters()).device
    seq2seq = hasattr(model, "encode")
    room = model.cfg.context_length - (1 if seq2seq else len(prompt))
    dec = Decoder(model, torch.tensor([prompt], device=device), None, start_id)
    logits = dec.start()  # (1, V)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    for _ in range(min(cfg.max_new_tokens, room)):
        if cfg.strategy == "greedy":
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(filter_logits(logits, cfg).softmax(-1), 1, generator=gen).squeeze(-1)
        yield int(nxt)
        if cfg.eos_id is not None and int(nxt) == cfg.eos_id:
            return
        logits = dec.step(nxt)


class TextStream:
    """Decoded text of a growing token list, handed out in pieces: a piece is held back while the
    tokens so far end inside a multi-byte character (decoded as U+FFFD)."""

    def __init__(self, decode):
        self.decode, self.ids, self.shown = decode, [], 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.shown = text[self.shown :], len(text)
        return piece

    @property
    def text(self) -> str:
        return self.decode(self.ids)


def prompt_ids(lm: LoadedModel, prompt: str) -> list[int]:
    """The prompt's token ids; an empty prompt is the end-of-text token (GPT-2's unconditional samples).
    A decoder-only model's prompt must leave room for a token in its context."""
    seq2seq = lm.start_id is not None
    ids = lm.tokenizer.encode(prompt, add_special_tokens=seq2seq).ids or [lm.eos_id]
    context = lm.model.cfg.context_length
    if len(ids) > context - (0 if seq2seq else 1):
        raise GlmError(
            f"--prompt is {len(ids)} tokens; this model reads at most {context - (0 if seq2seq else 1)} "
            f"(context length {context}{'' if seq2seq else ', one kept for the next token'}): shorten it"
        )
    return ids


def generate_to(
    out: TextIO,
    checkpoint: str,
    prompt: str,
    *,
    strategy: str = "greedy",
    max_new_tokens: int = 64,
    seed: int = 0,
    **options,
) -> str:
    """``glm generate``: the continuation written to ``out`` piece by piece (greedy, sample) or at
    once (beam); returns it. ``options``: GenerationConfig's (num_beams, temperature, top_k, ...)."""
    with contextlib.redirect_stdout(sys.stderr):  # libraries' start-up messages (DeepSpeed's) stay off ``out``
        lm = load_decoder(checkpoint)
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, strategy=strategy, eos_id=lm.eos_id, seed=seed, **options)
    ids = prompt_ids(lm, prompt)
    decode = lambda toks: lm.tokenizer.decode([t for t in toks if t != lm.eos_id])  # noqa: E731
    if strategy == "beam":
        device = next(lm.model.parameters()).device
        seq = generate(lm.model, torch.tensor([ids], device=device), cfg, start_id=lm.start_id)[0].tolist()
        text = decode(seq[1:] if lm.start_id is not None else seq[len(ids) :])
        out.write(text + "\n")
        return text
    stream = TextStream(decode)
    for token in stream_tokens(lm.model, ids, cfg, start_id=lm.start_id):
        out.write(stream.push(token))
        out.flush()
    out.write(stream.text[stream.shown :] + "\n")  # what was held back: the output ended inside a character
    return stream.text
