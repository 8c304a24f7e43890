"""The data-pipeline recipe: inputs, output, benchmarks and every stage's settings.

Recipes are YAML files under ``configs/data/`` read with the same rules as training configs
(``base:`` inheritance, strict keys, ``key=value`` overrides). The defaults are the published
thresholds (docs/reference.md#crawl-pipeline-thresholds); a rule whose threshold is set to ``null`` is disabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from data_pipeline.remote import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, RETRIES
from glm_common.config_bounds import check_bounds
from glm_common.config_yaml import ConfigError, load_structured


@dataclass
class ReaderCfg:
    format: Literal["auto", "warc", "jsonl", "parquet", "text"] = "auto"
    text_field: str = "text"
    id_field: Optional[str] = "id"  # null: every document id is FILE:LINE (JSONL) or FILE (text)
    max_record_mb: float = 10.0  # larger records (pages, JSON lines, text files) are skipped and counted
    # A compressed input that inflates beyond this many times the bytes read so far (+ 16 MiB) is a
    # bomb: the file ends there as an input error. Web text compresses 3-10x (gzip), boilerplate-heavy
    # JSONL up to ~20-50x; deflate's ceiling is ~1030x (a gzip bomb is all zeros), bz2/xz/zstd bombs go
    # far beyond. 100 leaves real data a wide margin and stops a bomb after ~30 MB of output.
    max_decompression_ratio: float = 100.0
    # Parquet decodes a row group's column chunk at once (arrow holds ~2-3x its size): a row group whose
    # uncompressed size (read from the file's metadata, before decoding) exceeds this is skipped and
    # its rows counted. Writers default to 64-128 MB row groups.
    max_row_group_mb: float = 512.0
    http_connect_timeout_s: float = CONNECT_TIMEOUT_S  # http(s) inputs: DNS + connect
    http_read_timeout_s: float = READ_TIMEOUT_S  # http(s) inputs: the longest wait for the next bytes
    http_retries: int = RETRIES  # http(s) inputs: retries (exponential backoff) of a transient failure
    max_docs_per_file: Optional[int] = None  # for trial runs


@dataclass
class ExtractCfg:
    enabled: bool = True
    main_content: bool = True  # drop navigation, headers, footers (resiliparse's main-content heuristics)
    max_replacement_frac: float = 0.01  # more U+FFFD than this after decoding: "undecodable text"


@dataclass
class LanguageCfg:
    enabled: bool = True
    languages: list = field(default_factory=lambda: ["en"])  # empty: keep every language
    threshold: float = 0.65
    max_chars: int = 10_000  # identify on the first characters only


@dataclass
class UrlCfg:
    enabled: bool = True
    blocklist: list = field(default_factory=list)  # domains; a page on the domain or a subdomain is dropped
    blocklist_files: list = field(default_factory=list)  # files (local or fsspec) with one domain per line
    banned_substrings: list = field(default_factory=list)  # dropped if the URL contains one


@dataclass
class GopherRepetitionCfg:
    enabled: bool = True
    dup_line_frac: Optional[float] = 0.30
    dup_line_char_frac: Optional[float] = 0.20
    dup_para_frac: Optional[float] = 0.30
    dup_para_char_frac: Optional[float] = 0.20
    top_ngram_char_frac: dict = field(default_factory=lambda: {2: 0.20, 3: 0.18, 4: 0.16})
    dup_ngram_char_frac: dict = field(default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10})


@dataclass
class GopherQualityCfg:
    enabled: bool = True
    min_words: Optional[int] = 50
    max_words: Optional[int] = 100_000
    min_mean_word_length: Optional[float] = 3.0
    max_mean_word_length: Optional[float] = 10.0
    max_symbol_word_ratio: Optional[float] = 0.1  # "#" and "..."/"…", each
    max_bullet_lines_frac: Optional[float] = 0.9
    max_ellipsis_lines_frac: Optional[float] = 0.3
    min_alpha_words_frac: Optional[float] = 0.8
    min_stop_words: Optional[int] = 2
    stop_words: list = field(default_factory=lambda: ["the", "be", "to", "of", "and", "that", "have", "with"])


@dataclass
class C4Cfg:
    enabled: bool = True
    min_words_per_line: Optional[int] = 5  # TFDS C4 (datatrove's default is 3)
    min_sentences: Optional[int] = 3  # TFDS C4 (datatrove's default is 5)
    max_word_length: Optional[int] = 1000
    terminal_punctuation: bool = True  # keep only lines ending in . ? ! " '
    remove_citations: bool = True  # [1] [edit] [citation needed]
    javascript: bool = True  # drop lines mentioning javascript
    policy: bool = True  # drop lines with terms-of-use / privacy / cookie phrases
    lorem_ipsum: bool = True  # drop the page
    curly_bracket: bool = True  # drop the page (code)
    bad_words_file: Optional[str] = None  # one word or phrase per line; drop the page on a match


@dataclass
class FineWebCfg:
    enabled: bool = True
    min_terminal_punct_lines_frac: Optional[float] = 0.12
    short_line_chars: int = 30
    max_short_lines_frac: Optional[float] = 0.67
    max_dup_line_char_frac: Optional[float] = 0.01
    max_newlines_per_word: Optional[float] = 0.3


@dataclass
class ClassifierCfg:
    enabled: bool = True  # runs when "classifier" is in stages
    model: Optional[str] = None  # written by `glm data train-classifier`
    alpha: float = 9.0  # keep iff pareto(alpha) > 1 - score (GPT-3)
    seed: int = 0


@dataclass
class DedupCfg:
    exact: bool = True
    minhash: bool = True
    ngram: int = 5  # word n-grams of simplified text (FineWeb)
    bands: int = 14
    rows: int = 8  # 14 x 8 = 112 hashes, ~0.72 Jaccard threshold
    seed: int = 1


@dataclass
class DecontamCfg:
    enabled: bool = True  # when benchmark files are given
    fields: list = field(
        default_factory=lambda: [
            "text",
            "question",
            "context",
            "passage",
            "sentence",
            "premise",
            "hypothesis",
            "answer",
            "goal",
            "ctx",
        ]
    )
    n: int = 13
    margin_chars: int = 200
    min_piece_chars: int = 200
    max_pieces: int = 10
    max_doc_freq: int = 10  # 13-grams in more training documents than this are ignored
    mode: Literal["cut", "drop_document"] = "cut"  # GPT-3 / lm-eval-harness, or Dolma's whole-document drop


@dataclass
class WriterCfg:
    docs_per_shard: int = 50_000
    write_dropped: bool = False  # dropped documents with their reason, under dropped/


@dataclass
class Recipe:
    name: str = "custom"
    input: list = field(default_factory=list)  # paths, globs or fsspec URLs; "sample" = the embedded crawl
    output: str = ""
    benchmarks: list = field(default_factory=list)  # JSONL / Parquet files (paths, globs, URLs)
    stages: list = field(
        default_factory=lambda: ["url", "extract", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb"]
    )
    workers: int = 0  # local processes (0: one per core)
    # Hash partitions of the corpus-wide stages (buckets, clusters, decontam): each of their tasks holds
    # one, so memory per task is about 1/partitions of the corpus's keys or pairs. 0: one per input
    # file, at most 256. Part of the run's identity (a rerun must keep it).
    partitions: int = 0
    reader: ReaderCfg = field(default_factory=ReaderCfg)
    extract: ExtractCfg = field(default_factory=ExtractCfg)
    language: LanguageCfg = field(default_factory=LanguageCfg)
    url: UrlCfg = field(default_factory=UrlCfg)
    gopher_repetition: GopherRepetitionCfg = field(default_factory=GopherRepetitionCfg)
    gopher_quality: GopherQualityCfg = field(default_factory=GopherQualityCfg)
    c4: C4Cfg = field(default_factory=C4Cfg)
    fineweb: FineWebCfg = field(default_factory=FineWebCfg)
    classifier: ClassifierCfg = field(default_factory=ClassifierCfg)
    dedup: DedupCfg = field(default_factory=DedupCfg)
    decontam: DecontamCfg = field(default_factory=DecontamCfg)
    writer: WriterCfg = field(default_factory=WriterCfg)


STAGES = ("url", "extract", "language", "gopher_repetition", "gopher_quality", "c4", "fineweb", "classifier")


def load_recipe(path: str | None, overrides: list[str] = ()) -> Recipe:
    recipe = load_structured(Recipe, path, overrides, lists=("input", "benchmarks"))
    check_bounds(recipe)  # every number in range: glm_common/config_bounds.py
    unknown = [s for s in recipe.stages if s not in STAGES]
    if unknown:
        raise ConfigError(f"stages: unknown stage(s) {unknown}; known: {list(STAGES)}")
    if not recipe.input:
        raise ConfigError("input: no input given (set input=PATH[,PATH...] or input=sample)")
    if not recipe.output:
        raise ConfigError("output: no output directory given (set output=DIR)")
    if "classifier" in recipe.stages and not recipe.classifier.model:
        raise ConfigError("classifier.model: the classifier stage needs a model file (glm data train-classifier)")
    return recipe
