"""What a family tells the rest of the library: its ``FamilySpec`` row (docs/architecture.md, decision 10).

Each family package builds its row(s) in ``families/<family>/spec.py`` from these types; the registry
(``families/registry.py``) only collects them. Pipelines and adapters are named as ``"module:function"``
and imported when used, so a row (and ``models/``) never imports DeepSpeed or transformers.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import nn


def option(help: str, *, bounds: str | None = None) -> Any:
    """A field of a family's options: unset (None: the flavor's value) unless the config sets it under
    ``model:``; ``help`` is shown by ``glm config keys``, ``bounds`` is its interval
    (glm_common/config_bounds.py's notation)."""
    metadata = {"help": help} | ({"bounds": bounds} if bounds else {})
    return field(default=None, metadata=metadata)


@dataclass
class NoOptions:
    """The options of a family that has none of its own."""


def _never(model_cfg: Any) -> bool:
    return False


class HFAdapter(Protocol):
    """What a family's transformers adapter module (``FamilySpec.hf``, ``families/<family>/hf.py``) provides:
    the same two functions in every family, so ``glm export-hf`` and an import need no per-family branch.
    A family's own extras are keyword options with defaults (GPT's ``pad_vocab_to_multiple_of``);
    tests/test_hf_import.py checks every adapter's signatures against these."""

    def export_hf(
        self,
        cfg: Any,
        state_dict: dict[str, torch.Tensor],
        out_dir: str,
        *,
        tokenizer_file: str | None = None,
        profile: str | None = None,
    ) -> None:
        """Write a folder the row's ``hf_classes`` and ``AutoTokenizer`` load: ``cfg`` and ``state_dict`` are
        the exported module's (ELECTRA's discriminator), ``profile`` the tokenizer profile naming the special
        tokens (None: the family's own)."""

    def import_hf(self, hf_model: Any) -> tuple[Any, dict[str, torch.Tensor]]:
        """A transformers model of the row's classes -> the exported module's config and state dict (the
        inverse of ``export_hf``'s names), ready for ``model(cfg).load_state_dict``."""


def save_exported(
    out_dir: str,
    hf_model: nn.Module,
    hf_state_dict: dict[str, torch.Tensor],
    tokenizer: Any = None,
    *,
    unused: tuple[str, ...] = (),
) -> None:
    """The end of every ``export_hf``: load an adapter's renamed weights into the transformers model it
    exports and write the folder ``from_pretrained`` reads, with the tokenizer (``hf_tokenizer``; None: the
    weights alone). Any name left over on either side is an error, except transformers' own buffers
    ending in ``unused`` (masks, position ids)."""
    missing, unexpected = hf_model.load_state_dict(hf_state_dict, strict=False)
    missing = [k for k in missing if not k.endswith(unused)] if unused else missing
    if missing or unexpected:
        raise RuntimeError(f"export mismatch: missing {missing}, unexpected {unexpected}")
    hf_model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


# the tokenizer roles (data_pipeline/tokenize/profiles.py) transformers names as ``<role>_token``; "eot" has no name
HF_TOKEN_ROLES = ("bos", "eos", "unk", "pad", "mask", "cls", "sep")


def hf_tokenizer(tokenizer_file: str | None, roles: dict[str, str], *, context_length: int, **options: Any) -> Any:
    """Our ``tokenizer.json`` as the transformers tokenizer an adapter saves beside its weights, so
    ``AutoTokenizer`` loads the folder: ``roles`` are its special tokens by role (those of ``HF_TOKEN_ROLES``
    are kept), ``options`` the family's own (padding side, input names). None without a tokenizer file (an
    export of the weights alone)."""
    if not tokenizer_file:
        return None
    from transformers import PreTrainedTokenizerFast  # rows never import transformers, adapters do when they run

    special = {f"{role}_token": token for role, token in roles.items() if role in HF_TOKEN_ROLES}
    return PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, model_max_length=context_length, **options, **special)


def state_dict_keys(model_cls: type[nn.Module], cfg: Any) -> list[str]:
    """The parameter and buffer names of ``model_cls(cfg)``, built on the meta device (no memory)."""
    with torch.device("meta"):
        return list(model_cls(cfg).state_dict())


@dataclass(frozen=True)
class PipelineSpec:
    build: str  # "module:function" -> PipelineModule of (model, stages=, topology=, partition=, ...)
    rename: str  # "module:function" -> unpipelined name of a stage's state-dict key: (key, n_layer) -> str | None
    objectives: tuple[str, ...]  # the objectives whose loss runs on the last stage
    refuse: Callable[[Any], str | None] = lambda cfg: None  # why a model config cannot be cut (None: it can)


@dataclass(frozen=True)
class FamilySpec:
    flavors: dict[str, Any]
    config: Callable[..., Any]  # (flavor, **overrides) -> the model config
    model: type[nn.Module]
    objectives: tuple[str, ...]  # what it trains
    # its tokenizer: a profile of data_pipeline/tokenize/profiles.py (kind and special tokens), what the family's
    # recipes set as data.tokenizer_profile
    tokenizer_profile: str = ""
    stacks: int = 1  # transformer stacks: 2 for encoder-decoders (layers count twice)
    pipeline: PipelineSpec | None = None
    # tensor parallelism: module class -> ShardPlan (models/common.py) of how parallel/tensor.py splits it
    # (attention heads, FFN width); empty: the family does not tensor-split
    tensor_plans: dict = field(default_factory=dict)
    # under tensor parallelism, module class -> VocabPlan (models/common.py) of its token embedding and tied
    # output, split by vocabulary; empty: they stay whole
    vocab_plans: dict = field(default_factory=dict)
    # its layers() list (embedding, blocks, head) cut along the sequence between the ends
    sequence_parallel: bool = False
    next_token_logits: bool = False  # a decoder-only LM: forward(ids (B, T)) -> logits (B, T, V) (rolling
    # perplexity of documents, lm-eval tasks in the training loop)
    # train.init=local: model config -> the std of each parameter's normal draw by its name (parallel/init.py
    # draws every parameter from its own seeded generator, so no rank builds the whole model); None: refused
    init_std: Callable[[Any], Callable[[str], float]] | None = None
    hf: str | None = None  # the transformers adapter: a module that is an HFAdapter (import_hf, export_hf)
    hf_classes: tuple[str, ...] = ()  # what the export loads in transformers
    exported: str | None = None  # the submodule exported and fine-tuned (ELECTRA's discriminator)
    finetune: tuple[str, ...] = ()  # glm finetune tasks it takes: classify | seq2seq | entailment | similarity |
    # multiple_choice | span | tokens
    finetune_with: str | None = None  # "module:function" fine-tuning it (None: transfer/classify.py's [CLS] classifier)
    summary_position: int = 0  # the position a classifier reads: BERT's [CLS] first, XLNet's <cls> last (-1)
    pad_left: bool = False  # fine-tuning inputs padded on the left (XLNet), so the last position is real
    decoder_start: str | None = None  # seq2seq: the token role the decoder starts from
    # "module:function" (model, manifest, shards_dir): before training, set what is read from the data set, not
    # learned (CoVe's frozen GloVe table)
    prepare: str | None = None
    # output projections of the blocks' attention / FFN sublayers (Houlsby adapters)
    adapter_sites: tuple[str, ...] = ()
    features: str | None = None  # "module:function" (model, tokenizer, texts, batch_size=) -> arrays (glm features)
    # the family's own config keys, a dataclass of option() fields: set under model: beside the generic ones,
    # validated when the config loads, handed to the config factory as overrides
    options: type = NoOptions
    # (cfg, model config, seq_len) -> None or ConfigError: the family's cross-field config checks
    check: Callable[[Any, Any, int], None] | None = None
    # model config -> whether training carries memory across steps (Transformer-XL's streams, train/streams.py)
    streams: Callable[[Any], bool] = _never
    # model-config fields added after checkpoints were saved -> the value those saves were written with, when
    # it is not the field's default (GPT-1's post_ln: True); model_config_from_dict fills them in
    saved_defaults: dict = field(default_factory=dict)

    @property
    def local_init(self) -> bool:
        """Whether train.init=local can draw its weights."""
        return self.init_std is not None

    @property
    def vocab_parallel(self) -> bool:
        """Whether its vocabulary splits under tensor parallelism."""
        return bool(self.vocab_plans)

    @property
    def tensor_parallel(self) -> bool:
        """Whether it tensor-splits at all."""
        return bool(self.tensor_plans)


def flavors_named(table: dict, prefix: str) -> dict:
    """The flavors of ``table`` whose names start with ``prefix`` (the encoder families share one table)."""
    return {name: f for name, f in table.items() if name.startswith(prefix)}


def resolve(ref: str) -> Callable:
    """``"module:function"`` -> the function (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)
