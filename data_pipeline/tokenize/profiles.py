"""Tokenizer profiles: a tokenizer kind and its special tokens, named after the vocabulary they
reproduce (a model family names the profile it trains with in its registry row).

A profile is trained with the ``tokenizers`` library and saved as ``tokenizer.json`` (which
transformers' ``PreTrainedTokenizerFast`` loads). Special tokens take the first ids, in the order
listed (the reference vocabularies' order); T5's 100 sentinels take the top ids, ``<extra_id_0>``
highest, counting down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from data_pipeline.tokenize.word import vocabulary, word_level


@dataclass(frozen=True)
class TokenizerProfile:
    kind: str  # byte-bpe | wordpiece | unigram | wordlevel
    specials: tuple[str, ...]
    roles: dict[str, str]  # role (eot, bos, eos, pad, unk, mask, cls, sep) -> token
    sentinels: int = 0
    single: str | None = None  # post-processor templates (transformers' encode with special tokens)
    pair: str | None = None


PROFILES: dict[str, TokenizerProfile] = {
    "gpt2": TokenizerProfile(
        "byte-bpe",
        ("<|endoftext|>",),
        {"eot": "<|endoftext|>", "bos": "<|endoftext|>", "eos": "<|endoftext|>", "unk": "<|endoftext|>"},
    ),
    "roberta": TokenizerProfile(  # fairseq's dictionary order
        "byte-bpe",
        ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
        {
            "bos": "<s>",
            "cls": "<s>",
            "pad": "<pad>",
            "eos": "</s>",
            "sep": "</s>",
            "eot": "</s>",
            "unk": "<unk>",
            "mask": "<mask>",
        },
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
    ),
    "bert": TokenizerProfile(
        "wordpiece",
        ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
        {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "eot": "[SEP]", "mask": "[MASK]"},
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    ),
    "albert": TokenizerProfile(
        "unigram",
        ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"),
        {"pad": "<pad>", "unk": "<unk>", "cls": "[CLS]", "sep": "[SEP]", "eot": "[SEP]", "mask": "[MASK]"},
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
    ),
    "t5": TokenizerProfile(
        "unigram",
        ("<pad>", "</s>", "<unk>"),
        {"pad": "<pad>", "eos": "</s>", "eot": "</s>", "unk": "<unk>"},
        sentinels=100,
        single="$A </s>",
        pair="$A </s> $B </s>",
    ),
    "xlnet": TokenizerProfile(
        "unigram",
        ("<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>"),
        {
            "unk": "<unk>",
            "bos": "<s>",
            "eos": "</s>",
            "cls": "<cls>",
            "sep": "<sep>",
            "pad": "<pad>",
            "mask": "<mask>",
            "eot": "<eod>",
        },
        single="$A <sep> <cls>",
        pair="$A <sep> $B:1 <sep>:1 <cls>:2",
    ),
    "word": TokenizerProfile(  # the most frequent words (data_pipeline/tokenize/word.py)
        "wordlevel",
        ("<pad>", "<unk>", "<bos>", "<eos>"),
        {"pad": "<pad>", "unk": "<unk>", "bos": "<bos>", "eos": "<eos>", "eot": "<eos>"},
    ),
}


def sentinel_tokens(n: int) -> list[str]:
    """T5's sentinels in id order: ``<extra_id_{n-1}>`` first, ``<extra_id_0>`` last (the top id)."""
    return [f"<extra_id_{i}>" for i in reversed(range(n))]


def train_tokenizer(profile_name: str, texts: Iterable[str], *, vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    if profile_name not in PROFILES:
        raise KeyError(f"unknown tokenizer profile {profile_name!r}; known: {', '.join(PROFILES)}")
    p = PROFILES[profile_name]
    size = vocab_size - p.sentinels
    if p.kind == "byte-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=size,
            min_frequency=min_frequency,
            special_tokens=list(p.specials),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif p.kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token=p.roles["unk"]))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=size, min_frequency=min_frequency, special_tokens=list(p.specials), show_progress=False
        )
    elif p.kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=size, special_tokens=list(p.specials), unk_token=p.roles["unk"], show_progress=False
        )
    elif p.kind == "wordlevel":
        tok, trainer = word_level(p.specials, unk=p.roles["unk"], vocab_size=size, min_frequency=min_frequency)
    else:
        raise ValueError(f"unknown tokenizer kind {p.kind!r}")
    tok.train_from_iterator(texts, trainer=trainer)
    if p.sentinels:
        tok.add_special_tokens(sentinel_tokens(p.sentinels))
    if p.single:
        specials = sorted({t for t in p.specials if t in (p.single + " " + (p.pair or ""))})
        tok.post_processor = processors.TemplateProcessing(
            single=p.single, pair=p.pair, special_tokens=[(t, tok.token_to_id(t)) for t in specials]
        )
    return tok


def special_ids(tok: Tokenizer, profile_name: str) -> dict:
    """Role -> id, plus T5 sentinel ids (``sentinels``: id of ``<extra_id_0>``, ``<extra_id_1>``, ...) and a
    word-level vocabulary's token strings in id order (``words``)."""
    p = PROFILES[profile_name]
    ids = {role: tok.token_to_id(token) for role, token in p.roles.items()}
    ids["all_specials"] = sorted({tok.token_to_id(t) for t in p.specials})
    if p.sentinels:
        ids["sentinels"] = [tok.token_to_id(f"<extra_id_{i}>") for i in range(p.sentinels)]
        ids["all_specials"] = sorted(set(ids["all_specials"]) | set(ids["sentinels"]))
    if p.kind == "wordlevel":  # the words themselves: ELMo's character CNN spells them at load time
        ids["words"] = vocabulary(tok)
    return ids
