"""Greedy decoding for the decoder-only and encoder-decoder families (the reference that exported
models' ``generate()`` is checked against). The encoder runs once; the decoder is re-run on the
growing prefix -- no key/value cache yet, so this is for evaluation and tests, not serving."""
from __future__ import annotations

import torch


@torch.no_grad()
def greedy_decoder_only(model, input_ids: torch.Tensor, *, max_new_tokens: int) -> torch.Tensor:
    seq = input_ids
    for _ in range(max_new_tokens):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq


@torch.no_grad()
def greedy_seq2seq(model, input_ids: torch.Tensor, *, start_id: int, eos_id: int, max_new_tokens: int,
                   attention_mask: torch.Tensor | None = None, forced_bos_id: int | None = None) -> torch.Tensor:
    """Decoder tokens (starting with ``start_id``) until every row has produced ``eos_id``."""
    memory = model.encode(input_ids, attention_mask)
    seq = torch.full((input_ids.shape[0], 1), start_id, dtype=torch.long, device=input_ids.device)
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    for step in range(max_new_tokens):
        nxt = model.decode(seq, memory, attention_mask)[:, -1].argmax(-1)
        if step == 0 and forced_bos_id is not None:
            nxt = torch.full_like(nxt, forced_bos_id)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)  # finished rows keep emitting eos
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        done |= nxt == eos_id
        if done.all():
            break
    return seq
