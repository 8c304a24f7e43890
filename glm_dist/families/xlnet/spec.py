"""XLNet's registry row: data parallelism and ZeRO; its classifier reads the last (<cls>) position of
left-padded inputs."""
from __future__ import annotations

from glm_dist.families.bert.spec import ENCODER_FINETUNE
from glm_dist.families.spec import FamilySpec
from glm_dist.families.xlnet import model as xlnet

FAMILIES = {
    "xlnet": FamilySpec(xlnet.FLAVORS, xlnet.xlnet_config, xlnet.XLNet, ("plm",), hf="glm_dist.families.xlnet.hf",
                        hf_classes=("XLNetLMHeadModel",), finetune=ENCODER_FINETUNE, summary_position=-1, pad_left=True,
                        adapter_sites=("attn.o", "ffn.proj")),
}
