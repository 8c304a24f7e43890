"""XLNet's registry row: data parallelism and ZeRO; its classifier reads the last (<cls>) position of
left-padded inputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from glm_common.config_bounds import TOKENS
from glm_common.config_yaml import ConfigError, source_of
from glm_dist.families.bert.spec import ENCODER_FINETUNE
from glm_dist.families.spec import FamilySpec, option
from glm_dist.families.xlnet import model as xlnet


@dataclass
class XLNetOptions:
    mem_len: Optional[int] = option(
        "Transformer-XL memory: hidden states kept per layer for the next segment (0: none; the flavor's by default)",
        bounds=f"[0, {TOKENS}]",
    )
    reuse_len: Optional[int] = option(
        "only a segment's first reuse_len positions enter the memory (0: all)", bounds=f"[0, {TOKENS}]"
    )
    bi_data: Optional[bool] = option("half the batch reads the text backwards (relative distances negated)")


def check_segment_layout(cfg: Any, mc: xlnet.XLNetConfig, seq_len: int) -> None:
    """The paper's data layout (objective.plm_layout=paper): segments of reuse_len continued tokens
    then A/B, over memory streams; bi_data's backward streams need it and an even micro batch."""
    reuse, mem, bi, layout = mc.reuse_len, mc.mem_len, mc.bi_data, cfg.objective.options.plm_layout
    if layout == "paper":
        n = seq_len
        if not (mem > 0 and 0 < reuse and n - reuse >= 8 and reuse % 2 == 0 and (n - reuse) % 2 == 0):
            raise ConfigError(
                f"objective.plm_layout=paper needs model.mem_len > 0 and an even model.reuse_len with "
                f"at least 8 (an even number of) tokens after it in data.seq_len; got mem_len={mem}, "
                f"reuse_len={reuse}, seq_len={n} ({source_of(cfg, 'objective.plm_layout')})"
            )
    if bi and (layout != "paper" or cfg.train.micro_batch_size % 2):
        raise ConfigError(
            f"model.bi_data reads odd streams backwards: it needs objective.plm_layout=paper and an even "
            f"train.micro_batch_size (forward rows first), got {layout} and "
            f"{cfg.train.micro_batch_size} ({source_of(cfg, 'model.bi_data')})"
        )


FAMILIES = {
    "xlnet": FamilySpec(
        xlnet.FLAVORS,
        xlnet.xlnet_config,
        xlnet.XLNet,
        ("plm",),
        tokenizer_profile="xlnet",
        hf="glm_dist.families.xlnet.hf",
        hf_classes=("XLNetLMHeadModel",),
        finetune=ENCODER_FINETUNE,
        summary_position=-1,
        pad_left=True,
        adapter_sites=("attn.o", "ffn.proj"),
        options=XLNetOptions,
        check=check_segment_layout,
        streams=lambda mc: mc.mem_len > 0,
    ),
}
