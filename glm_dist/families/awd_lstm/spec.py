"""AWD-LSTM's registry row: ULMFiT's LM; its classifier (concat pooling over BPT3C windows) through
glm_dist/transfer/ulmfit.py."""

from __future__ import annotations

from glm_dist.families.awd_lstm import model as awd_lstm
from glm_dist.families.spec import FamilySpec

FAMILIES = {
    "awd-lstm": FamilySpec(
        awd_lstm.FLAVORS,
        awd_lstm.awd_lstm_config,
        awd_lstm.AwdLstm,
        ("awd_lm",),
        tokenizer_profile="word",
        finetune=("classify",),
        finetune_with="glm_dist.transfer.ulmfit:finetune_ulmfit",
    ),
}
