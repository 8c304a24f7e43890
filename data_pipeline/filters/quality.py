"""Heuristic quality rules: Gopher repetition, Gopher quality, C4 and FineWeb.

Each rule set is a function ``(text, cfg) -> (reason | None, text)``: a reason names the first
rule that drops the document (``None`` keeps it); C4's line rules also return the text with the
dropped lines removed. Thresholds come from the recipe (published values by default); a threshold
set to ``None`` turns that rule off.
"""

from __future__ import annotations

import re

from data_pipeline.filters.text import (
    LINE_SPLIT,
    PARAGRAPH_SPLIT,
    TERMINAL,
    count_sentences,
    duplicated_ngram_chars,
    duplicates,
    is_symbol,
    top_ngram_chars,
    words,
)
from data_pipeline.recipe import C4Cfg, FineWebCfg, GopherQualityCfg, GopherRepetitionCfg

Result = tuple[str | None, str]


def gopher_repetition(text: str, cfg: GopherRepetitionCfg) -> Result:
    if not text.strip():
        return "empty", text
    n_chars = len(text)
    paragraphs = PARAGRAPH_SPLIT.split(text.strip())
    dup, dup_chars = duplicates(paragraphs)
    if cfg.dup_para_frac is not None and dup / len(paragraphs) > cfg.dup_para_frac:
        return "gopher_rep: duplicate paragraphs", text
    if cfg.dup_para_char_frac is not None and dup_chars / n_chars > cfg.dup_para_char_frac:
        return "gopher_rep: duplicate paragraph chars", text
    lines = LINE_SPLIT.split(text)
    dup, dup_chars = duplicates(lines)
    if cfg.dup_line_frac is not None and dup / len(lines) > cfg.dup_line_frac:
        return "gopher_rep: duplicate lines", text
    if cfg.dup_line_char_frac is not None and dup_chars / n_chars > cfg.dup_line_char_frac:
        return "gopher_rep: duplicate line chars", text
    ws = words(text)
    for n, limit in sorted((int(k), v) for k, v in cfg.top_ngram_char_frac.items()):
        if limit is not None and top_ngram_chars(ws, n) / n_chars > limit:
            return f"gopher_rep: top {n}-gram", text
    for n, limit in sorted((int(k), v) for k, v in cfg.dup_ngram_char_frac.items()):
        if limit is not None and duplicated_ngram_chars(ws, n) / n_chars > limit:
            return f"gopher_rep: duplicated {n}-grams", text
    return None, text


def gopher_quality(text: str, cfg: GopherQualityCfg) -> Result:
    ws = words(text)
    if not ws:
        return "gopher_quality: no words", text
    content = [w for w in ws if not is_symbol(w)]
    n = len(ws)
    if cfg.min_words is not None and len(content) < cfg.min_words:
        return "gopher_quality: too few words", text
    if cfg.max_words is not None and len(content) > cfg.max_words:
        return "gopher_quality: too many words", text
    mean_len = sum(map(len, content)) / max(1, len(content))
    if cfg.min_mean_word_length is not None and mean_len < cfg.min_mean_word_length:
        return "gopher_quality: mean word length too short", text
    if cfg.max_mean_word_length is not None and mean_len > cfg.max_mean_word_length:
        return "gopher_quality: mean word length too long", text
    if cfg.max_symbol_word_ratio is not None:
        if text.count("#") / n > cfg.max_symbol_word_ratio:
            return "gopher_quality: too many #", text
        if (text.count("...") + text.count("…")) / n > cfg.max_symbol_word_ratio:
            return "gopher_quality: too many ellipses", text
    lines = text.splitlines() or [""]
    if cfg.max_bullet_lines_frac is not None:
        bullets = sum(line.lstrip().startswith(("•", "-")) for line in lines)
        if bullets / len(lines) > cfg.max_bullet_lines_frac:
            return "gopher_quality: too many bullet lines", text
    if cfg.max_ellipsis_lines_frac is not None:
        ellipsis = sum(line.rstrip().endswith(("...", "…")) for line in lines)
        if ellipsis / len(lines) > cfg.max_ellipsis_lines_frac:
            return "gopher_quality: too many lines ending in an ellipsis", text
    if cfg.min_alpha_words_frac is not None:
        alpha = sum(any(ch.isalpha() for ch in w) for w in ws)
        if alpha / n < cfg.min_alpha_words_frac:
            return "gopher_quality: too few words with a letter", text
    if cfg.min_stop_words is not None:
        found = set(cfg.stop_words).intersection(w.lower() for w in ws)
        if len(found) < cfg.min_stop_words:
            return "gopher_quality: too few stop words", text
    return None, text


CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
C4_END = (".", "?", "!", '"', "'")


def c4(text: str, cfg: C4Cfg, bad_words: re.Pattern | None = None) -> Result:
    """C4's rules (Raffel et al. 2020, TFDS c4_utils): line filters, then page-level drops."""
    kept, sentences = [], 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        ws = line.split()
        if cfg.max_word_length is not None and any(len(w) > cfg.max_word_length for w in ws):
            continue
        if cfg.remove_citations:
            line = CITATION.sub("", line)
        if cfg.terminal_punctuation and (not line.endswith(C4_END) or line.endswith("...")):
            continue
        if cfg.min_words_per_line is not None and len(ws) < cfg.min_words_per_line:
            continue
        lower = line.lower()
        if cfg.lorem_ipsum and "lorem ipsum" in lower:
            return "c4: lorem ipsum", text
        if cfg.javascript and "javascript" in lower:
            continue
        if cfg.curly_bracket and "{" in line:
            return "c4: curly bracket", text
        if cfg.policy and any(p in lower for p in POLICY):
            continue
        sentences += count_sentences(line)
        kept.append(line)
    if cfg.min_sentences is not None and sentences < cfg.min_sentences:
        return "c4: too few sentences", text
    out = "\n".join(kept).strip()
    if bad_words is not None and bad_words.search(out.lower()):
        return "c4: bad word", text
    return None, out


def fineweb(text: str, cfg: FineWebCfg) -> Result:
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return "fineweb: empty", text
    if cfg.min_terminal_punct_lines_frac is not None:
        ended = sum(line.rstrip()[-1:] in TERMINAL for line in lines)
        if ended / len(lines) < cfg.min_terminal_punct_lines_frac:
            return "fineweb: too few lines ending in punctuation", text
    if cfg.max_short_lines_frac is not None:
        short = sum(len(line) <= cfg.short_line_chars for line in lines)
        if short / len(lines) > cfg.max_short_lines_frac:
            return "fineweb: too many short lines", text
    if cfg.max_dup_line_char_frac is not None:
        _, dup_chars = duplicates(lines)
        if dup_chars / max(1, len(text.replace("\n", ""))) > cfg.max_dup_line_char_frac:
            return "fineweb: duplicated line chars", text
    if cfg.max_newlines_per_word is not None:
        n_words = len(words(text))
        if n_words == 0 or text.count("\n") / n_words > cfg.max_newlines_per_word:
            return "fineweb: too many newlines per word (list-like)", text
    return None, text


def load_bad_words(path: str | None) -> re.Pattern | None:
    if not path:
        return None
    from data_pipeline.remote import read_limited

    lines = read_limited(path, 64 * 2**20).decode("utf-8", "replace").splitlines()
    entries = sorted({line.strip().lower() for line in lines if line.strip()}, key=len, reverse=True)
    if not entries:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, entries)) + r")(?!\w)")
