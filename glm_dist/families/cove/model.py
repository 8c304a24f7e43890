"""CoVe (McCann et al. 2017): the encoder of an attentional LSTM translation model, whose states are
context vectors for downstream tasks: CoVe(w) = MT-LSTM(GloVe(w)).

- Input: GloVe vectors, frozen -- a persistent buffer ``glove`` (source vocabulary x d_input) that
  the family's ``prepare`` fills from the pair set's ``source_vectors.npy`` before training (the
  source vocabulary *is* GloVe's, data_pipeline/tokenize/pairs.py) and checkpoints carry.
- Encoder (the MT-LSTM): two bidirectional LSTM layers of ``d_model`` per direction (300), each run
  over packed sequences, so padding never reaches a real position; layer k's [forward; backward]
  states are CoVe-L{k} (600 wide).
- Decoder: a two-layer LSTM with input feeding and attention over the top encoder states
  (glm_dist/models/recurrent.py ``AttentionLSTMDecoder``), h~_t = tanh(W2 [H^T alpha_t; s_t] + b2),
  output softmax(W_out h~_t + b_out). Its width is the encoder's 2 x d_model (OpenNMT-py's
  bidirectional layout, which the authors trained with); it starts from zero states.

``encode`` / ``decode(tokens, memory, mask, cache=)`` are the interface glm_dist/models/generate.py
drives (greedy and beam search): ``decoder.blocks`` sizes its cache.

Cross-View Training for translation (Clark et al. 2018, section 3.3; ``cvt_decoders: true``, the
``cvt_translation`` objective): two auxiliary decoders that share the target embedding and the
decoder's LSTMs with the primary one but have their own attention (W1, W2) and softmax layer. One
sees the source through ``cvt_attention_dropout`` (a fraction of its attention weights zeroed); the
other predicts the word after the current one (``future``: its state at t has read y_<t and scores
y_{t+1}). ``forward(..., mode="student")`` runs the shared decoder with the primary's attention
outside the graph (input feeding takes its h~ as a constant) and returns both views' logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from glm_dist.errors import GlmError
from glm_dist.models.common import Flavor, flavor_config
from glm_dist.models.recurrent import AttentionLSTMDecoder, LSTMLayer, global_attention

MAX_VECTOR_BYTES = 16 * 2**30  # the 840B GloVe table at 2.2M x 300 float32 is 2.6 GB


@dataclass(frozen=True)
class CoVeConfig:
    vocab_size: int  # source tokens: GloVe's words + <pad> <unk> <bos> <eos>
    target_vocab_size: int
    d_input: int = 300  # GloVe vector size
    d_model: int = 300  # encoder LSTM cells per direction (CoVe is 2 x d_model wide)
    n_layer: int = 2  # encoder layers; the decoder has as many
    d_embed: int = 300  # target word embeddings
    dropout: float = 0.2  # the paper: on the inputs and outputs of every encoder and decoder layer
    context_length: int = 64  # tokens per side of a training pair (longer sides are cut)
    n_head: int = 1  # (no attention heads: the layout checks read it)
    cvt_decoders: bool = False  # two auxiliary decoders for Cross-View Training (the cvt_translation objective)
    cvt_attention_dropout: float = 0.5  # the attention-dropout view's rate (our choice: the paper gives none)
    cvt_beam: int = 4  # the teacher's beam on unlabelled sources: its best translation is the views' target


# The published count is the MT-LSTM encoder CoVe exports (the authors' released PyTorch weights:
# two bidirectional nn.LSTM layers 300 -> 300 and 600 -> 300, two bias vectors each): 3,609,600. The
# GloVe table is a buffer, and the decoder is not part of CoVe. Vocabularies: GloVe 840B's 2,196,017
# words; the target's 50,000 is OpenNMT-py's default (check against the authors' WMT training).
FLAVORS: dict[str, Flavor] = {
    "cove-tiny": Flavor(
        CoVeConfig(
            vocab_size=4096, target_vocab_size=8192, d_input=50, d_model=64, d_embed=64, dropout=0.1, context_length=32
        )
    ),
    "cove": Flavor(
        CoVeConfig(vocab_size=2_196_021, target_vocab_size=50_004),
        3.6096e6,
        0.001,
        "the MT-LSTM encoder (decoder and GloVe table excluded)",
    ),
}


cove_config = flavor_config(FLAVORS, "CoVe")


class CoVe(nn.Module):
    def __init__(self, cfg: CoVeConfig):
        super().__init__()
        self.cfg = cfg
        d = 2 * cfg.d_model
        self.register_buffer("glove", torch.zeros(cfg.vocab_size, cfg.d_input))  # frozen inputs, saved
        self.encoder = nn.ModuleList(
            LSTMLayer(cfg.d_input if i == 0 else d, cfg.d_model, bidirectional=True) for i in range(cfg.n_layer)
        )
        self.target_embed = nn.Embedding(cfg.target_vocab_size, cfg.d_embed)
        self.decoder = AttentionLSTMDecoder(cfg.d_embed, d, d, num_layers=cfg.n_layer, dropout=cfg.dropout)
        self.out = nn.Linear(d, cfg.target_vocab_size)
        self.drop = nn.Dropout(cfg.dropout)
        if cfg.cvt_decoders:
            self.auxiliary = nn.ModuleDict(
                {
                    "attention_dropout": AuxiliaryDecoder(d, cfg.target_vocab_size, cfg.cvt_attention_dropout),
                    "future": AuxiliaryDecoder(d, cfg.target_vocab_size),
                }
            )
        self.activation_checkpointing = False  # (not used: the recurrences dominate)

    def layers(self) -> list[nn.Module]:
        """The parts in order (for planning): encoder layers, target embedding, decoder, output (and
        the auxiliary decoders)."""
        return [*self.encoder, self.target_embed, self.decoder, self.out, *getattr(self, "auxiliary", {}).values()]

    def encoder_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[torch.Tensor]:
        """[GloVe(x) (B, S, d_input), CoVe-L1 (B, S, 2 d_model), CoVe-L2, ...]: zeros at padding."""
        x = self.glove[input_ids]
        lengths = None if attention_mask is None else attention_mask.sum(dim=1)
        out = [x]
        for i, layer in enumerate(self.encoder):
            x, _ = layer(self.drop(x) if i else x, lengths)
            out.append(x)
        return out

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """H: the top layer's states (B, S, 2 d_model)."""
        return self.encoder_states(input_ids, attention_mask)[-1]

    def decode(
        self,
        tokens: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: list[dict] | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, V_target) of the tokens after ``tokens`` (B, T), teacher-forced."""
        return self.out(self.decoder(self.target_embed(tokens), memory, mask, cache))

    def forward(
        self,
        input_ids: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        mode: str = "primary",
    ) -> dict:
        """``primary``: ``logits`` (B, T, V) of the tokens after ``decoder_input_ids``; ``student``:
        ``auxiliary``, view -> (B, T, V) logits, where the ``future`` view's position t scores the
        token after the one the primary's position t scores."""
        memory = self.encode(input_ids, attention_mask)
        if mode == "primary":
            return {"logits": self.decode(decoder_input_ids, memory, attention_mask)}
        if mode != "student" or not self.cfg.cvt_decoders:
            raise ValueError(f"mode={mode!r}: 'primary', or 'student' for a model built with cvt_decoders=true")
        _, states = self.decoder(
            self.target_embed(decoder_input_ids), memory, attention_mask, frozen_attention=True, return_states=True
        )
        states = self.drop(states)
        return {"auxiliary": {name: view(states, memory, attention_mask) for name, view in self.auxiliary.items()}}

    def num_params(self, *, encoder_only: bool = False) -> int:
        """Parameters; ``encoder_only``: the MT-LSTM alone (what CoVe is, as the authors release it)."""
        return sum(p.numel() for p in (self.encoder if encoder_only else self).parameters())

    def num_flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per target token, 6 per weight use: the encoder (about as many source tokens
        as target ones), every decoder weight, attention over ``seq_len`` source states twice."""
        uses = sum(p.numel() for m in (self.encoder, self.decoder, self.out) for p in m.parameters())
        return 6 * uses + 6 * 2 * seq_len * 2 * self.cfg.d_model


class AuxiliaryDecoder(nn.Module):
    """A CVT prediction module for translation: its own global attention and softmax over the shared
    decoder's top states s (B, T, d), optionally with attention-weight dropout in training."""

    def __init__(self, d: int, target_vocab_size: int, attention_dropout: float = 0.0):
        super().__init__()
        self.query, self.combine = nn.Linear(d, d), nn.Linear(2 * d, d)
        self.out = nn.Linear(d, target_vocab_size)
        self.attention_dropout = attention_dropout

    def forward(self, states: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        rate = self.attention_dropout if self.training else 0.0
        return self.out(global_attention(states, memory, mask, self.query, self.combine, weight_dropout=rate))


def load_inputs(model: CoVe, manifest: dict, shards_dir: str) -> None:
    """The family's ``prepare``: fill the GloVe table from the pair set (checking its shape against
    the model config) -- run by the trainer on a freshly built model."""
    entry = manifest.get("source_vectors")
    if entry is None:
        raise GlmError(
            f"{shards_dir} is not a translation pair set (no source_vectors): build it with "
            f"glm data tokenize -c CONFIG (data.source: a glm data gettext folder, data.vectors: GloVe)"
        )
    cfg = model.cfg
    if entry["dim"] != cfg.d_input or entry["rows"] > cfg.vocab_size:
        raise GlmError(
            f"the pair set's GloVe table is {entry['rows']} x {entry['dim']} but the model takes "
            f"model.vocab_size={cfg.vocab_size} x d_input={cfg.d_input}: use a flavor whose d_input is "
            f"{entry['dim']} and set model.vocab_size >= {entry['rows']}"
        )
    target = manifest["target_tokenizer"]["vocab_size"]
    if target > cfg.target_vocab_size:
        raise GlmError(
            f"the pair set's target tokenizer has {target} tokens but the {cfg.target_vocab_size}-word "
            f"output layer of this flavor is smaller: build the set with data.target_vocab_size <= "
            f"{cfg.target_vocab_size}"
        )
    path = f"{shards_dir}/{entry['file']}"
    with open(path, "rb") as f:
        if f.seek(0, 2) > MAX_VECTOR_BYTES:
            raise GlmError(f"{path}: larger than {MAX_VECTOR_BYTES >> 30} GiB, so not this set's GloVe table")
        f.seek(0)
        table = np.load(f, allow_pickle=False)
    if table.shape != (entry["rows"], entry["dim"]):
        raise GlmError(f"{path}: shape {table.shape}, the manifest says ({entry['rows']}, {entry['dim']})")
    with torch.no_grad():
        model.glove.zero_()
        model.glove[: len(table)] = torch.from_numpy(table).to(model.glove.dtype)
