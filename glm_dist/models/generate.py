"""Text generation with a key/value cache, shared by the decoder-only (GPT) and encoder-decoder
(T5, BART) families: greedy, beam search, and sampling with temperature / top-k / nucleus (top-p).

A ``Decoder`` hides the family: the encoder (if any) runs once; each step feeds only the new
tokens through the cached decoder. Beam search follows transformers' beam scorer (hypotheses end
at EOS, scored by sum of log-probabilities / length ** length_penalty, EOS taken only from the top
``num_beams`` candidates, stop once every input has ``num_beams`` finished hypotheses, or with
``early_stopping=False`` once no running beam can beat them; a ``stop`` predicate on the generated
tokens ends a hypothesis as EOS does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 32
    strategy: str = "greedy"  # greedy | beam | sample
    num_beams: int = 4
    length_penalty: float = 1.0
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    eos_id: int | None = None
    seed: int = 0
    # beam: True stops an input once it has num_beams finished hypotheses; False (transformers' default)
    # goes on while a running beam, normalised at its current length, could still beat the worst finished one
    early_stopping: bool = True


class Decoder:
    """Incremental decoding over one model: ``start()`` gives the first logits, ``step(tokens)``
    the next ones, ``reorder(index)`` follows beam search's choice of rows."""

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, start_id: int | None):
        self.model, self.seq2seq = model, hasattr(model, "encode")
        blocks = model.decoder.blocks if self.seq2seq else model.blocks
        self.cache = [{} for _ in blocks]
        if self.seq2seq:
            self.memory, self.mask = model.encode(input_ids, attention_mask), attention_mask
            self.prefix = torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=input_ids.device)
        else:
            self.prefix = input_ids

    def _logits(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.seq2seq:
            return self.model.decode(tokens, self.memory, self.mask, cache=self.cache)[:, -1].float()
        return self.model(tokens, self.cache)[:, -1].float()

    def start(self) -> torch.Tensor:
        return self._logits(self.prefix)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._logits(tokens[:, None])

    def reorder(self, index: torch.Tensor) -> None:
        def pick(obj):
            if torch.is_tensor(obj):
                return obj.index_select(0, index)
            return {k: pick(v) for k, v in obj.items()} if isinstance(obj, dict) else obj

        self.cache = [pick(c) for c in self.cache]
        if self.seq2seq:
            self.memory = self.memory.index_select(0, index)
            self.mask = None if self.mask is None else self.mask.index_select(0, index)


@torch.no_grad()
def generate(
    model,
    input_ids: torch.Tensor,
    cfg: GenerationConfig,
    *,
    attention_mask: torch.Tensor | None = None,
    start_id: int | None = None,
    stop: Callable[[list[int]], bool] | None = None,
) -> torch.Tensor:
    """Output tokens: the prompt and continuation (decoder-only) or the decoder sequence starting
    with ``start_id`` (encoder-decoder). Rows that finished early are padded with EOS. Beam search
    only: ``stop(generated tokens)`` true ends a hypothesis as EOS does (a stop sequence's text)."""
    if cfg.strategy == "beam":
        return _beam(model, input_ids, cfg, attention_mask, start_id, stop)
    dec = Decoder(model, input_ids, attention_mask, start_id)
    seq, logits = dec.prefix, dec.start()
    done = torch.zeros(seq.shape[0], dtype=torch.bool, device=seq.device)
    gen = torch.Generator(device=seq.device).manual_seed(cfg.seed)
    for _ in range(cfg.max_new_tokens):
        nxt = logits.argmax(-1) if cfg.strategy == "greedy" else _sample(logits, cfg, gen)
        if cfg.eos_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, cfg.eos_id), nxt)
            done |= nxt == cfg.eos_id
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        if done.all():
            break
        logits = dec.step(nxt)
    return seq


def filter_logits(logits: torch.Tensor, cfg: GenerationConfig) -> torch.Tensor:
    """Temperature, then top-k, then nucleus: tokens outside get -inf (at least one survives)."""
    logits = logits / cfg.temperature
    if cfg.top_k:
        kth = logits.topk(min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= cfg.top_p  # mass before this token already >= p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def _sample(logits: torch.Tensor, cfg: GenerationConfig, gen: torch.Generator) -> torch.Tensor:
    probs = filter_logits(logits, cfg).softmax(-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _beam(model, input_ids, cfg: GenerationConfig, attention_mask, start_id, stop=None) -> torch.Tensor:
    B, K = input_ids.shape[0], cfg.num_beams
    expand = torch.arange(B, device=input_ids.device).repeat_interleave(K)
    dec = Decoder(
        model,
        input_ids.index_select(0, expand),
        None if attention_mask is None else attention_mask.index_select(0, expand),
        start_id,
    )
    seq, logits = dec.prefix, dec.start()
    prompt = seq.shape[1]  # hypotheses are length-normalised by the tokens generated after it
    scores = torch.zeros(B, K, device=seq.device)
    scores[:, 1:] = -1e9  # all beams start identical: only the first one expands at step 0
    finished: list[list[tuple[float, torch.Tensor]]] = [[] for _ in range(B)]
    open_ = [True] * B  # False once no running beam can improve the input's finished ones
    for _ in range(cfg.max_new_tokens):
        logp = F.log_softmax(logits, -1)  # (B*K, V)
        V = logp.shape[-1]
        cand = (scores.view(-1, 1) + logp).view(B, K * V)
        top, idx = cand.topk(2 * K, dim=-1)
        keep_rows, keep_tokens, keep_scores = [], [], []
        for b in range(B):
            chosen = 0
            for rank, (score, j) in enumerate(zip(top[b].tolist(), idx[b].tolist())):
                row, tok = b * K + j // V, j % V
                if (cfg.eos_id is not None and tok == cfg.eos_id) or (
                    stop is not None and stop(seq[row, prompt:].tolist() + [tok])
                ):
                    if rank < K and open_[b]:
                        hyp = torch.cat([seq[row], seq.new_tensor([tok])])
                        _finish(finished[b], score / (hyp.shape[0] - prompt) ** cfg.length_penalty, hyp, K)
                    continue
                keep_rows.append(row), keep_tokens.append(tok), keep_scores.append(score)
                chosen += 1
                if chosen == K:
                    break
            for _ in range(K - chosen):  # every candidate ended (a stop sequence): dead beams keep the shape
                keep_rows.append(b * K + idx[b, 0].item() // V), keep_tokens.append(idx[b, 0].item() % V)
                keep_scores.append(-1e9)
        rows = torch.tensor(keep_rows, device=seq.device)
        tokens = torch.tensor(keep_tokens, device=seq.device)
        seq = torch.cat([seq.index_select(0, rows), tokens[:, None]], dim=1)
        scores = torch.tensor(keep_scores, device=seq.device).view(B, K)
        for b in range(B):  # transformers' early-stop heuristic, at the current length
            best = scores[b, 0].item() / (seq.shape[1] - prompt) ** cfg.length_penalty
            full = len(finished[b]) >= K
            open_[b] = open_[b] and not (full and (cfg.early_stopping or best <= min(f[0] for f in finished[b])))
        if not any(open_):
            break
        dec.reorder(rows)
        logits = dec.step(tokens)
    outputs = []
    for b in range(B):
        pool = list(finished[b])
        if open_[b]:  # ran out of tokens: the running beams compete with the finished ones
            for k in range(K):
                _finish(pool, scores[b, k].item() / (seq.shape[1] - prompt) ** cfg.length_penalty, seq[b * K + k], K)
        outputs.append(max(pool, key=lambda item: item[0])[1])
    width = max(o.shape[0] for o in outputs)
    pad = cfg.eos_id if cfg.eos_id is not None else 0
    return torch.stack([F.pad(o, (0, width - o.shape[0]), value=pad) for o in outputs])


def _finish(pool: list[tuple[float, torch.Tensor]], score: float, hyp: torch.Tensor, K: int) -> None:
    """Keep a finished hypothesis among the K best (transformers' BeamHypotheses.add)."""
    if len(pool) < K:
        pool.append((score, hyp))
    else:
        worst = min(range(len(pool)), key=lambda i: pool[i][0])
        if score > pool[worst][0]:
            pool[worst] = (score, hyp)
