"""WordNet 3.0 read straight from its database files (Debian's ``wordnet-base``: /usr/share/wordnet).

No nltk and no download: the ``data.{noun,verb,adj,adv}`` files (format: ``man 5 wndb``) hold one
synset per line::

    offset lex_filenum ss_type w_cnt(hex) [word lex_id(hex)]... p_cnt [symbol offset pos src/tgt]...
        [verbs: f_cnt [+ f_num w_num]...] | gloss

``Synset`` keeps the lemmas (underscores turned to spaces, adjective markers such as ``(p)`` taken
off), the part of speech (``n v a s r``: ``s`` an adjective satellite), the gloss split into its
definition and its quoted examples, the pointers (``@`` hypernym, ``!`` antonym, ...) and its
lexicographer file (the supersense, e.g. ``noun.animal``); ``exceptions`` reads the lists of irregular
forms (``*.exc``) that WordNet's morphology consults. Reads are bounded: a file over
``MAX_FILE_BYTES`` or a line over ``MAX_LINE_BYTES`` is refused.

Install: ``apt-get install -y --no-install-recommends wordnet-base`` (``launch/setup_env.sh`` does,
where it can); ``WNSEARCHDIR`` points elsewhere, as for WordNet's own tools.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from data_pipeline.errors import PipelineError

DEFAULT_DIR = "/usr/share/wordnet"
FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}  # satellites (s) live in data.adj
INDEX = {"n": "index.noun", "v": "index.verb", "a": "index.adj", "r": "index.adv"}
EXCEPTIONS = {"n": "noun.exc", "v": "verb.exc", "a": "adj.exc", "r": "adv.exc"}  # irregular forms -> base forms
# The lexicographer files by number (lexnames(5)): a synset's supersense, 45 classes.
LEXNAMES = (
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
)
MAX_FILE_BYTES = 64 * 2**20  # data.noun is 15 MB
MAX_LINE_BYTES = 64 * 2**10
ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")


class WordNetMissing(PipelineError):
    """The WordNet database files are not where they were looked for."""


@dataclass(frozen=True)
class Pointer:
    symbol: str  # @ hypernym, ~ hyponym, ! antonym, & similar to, ... (wndb(5))
    offset: int
    pos: str
    source: int  # lemma number in this synset (0: the whole synset)
    target: int


@dataclass(frozen=True)
class Synset:
    offset: int
    pos: str  # n v a s r
    lemmas: tuple[str, ...]
    definition: str
    examples: tuple[str, ...]
    pointers: tuple[Pointer, ...]
    lexname: str = ""  # its lexicographer file (LEXNAMES), e.g. noun.animal: the supersense


def wordnet_dir(root: str | None = None) -> Path:
    path = Path(root or os.environ.get("WNSEARCHDIR") or DEFAULT_DIR)
    if not (path / FILES["n"]).is_file():
        raise WordNetMissing(
            f"WordNet's database files are not in {path}: apt-get install -y wordnet-base "
            f"(launch/setup_env.sh does), or set WNSEARCHDIR to their directory"
        )
    return path


def parse_line(line: str) -> Synset:
    """One synset line of a data file (``ValueError`` if it is not one)."""
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    offset, pos, count = int(fields[0]), fields[2], int(fields[3], 16)
    lemmas = tuple(ADJ_MARKER.sub("", w).replace("_", " ") for w in fields[4 : 4 + 2 * count : 2])
    at = 4 + 2 * count
    pointers = []
    for k in range(int(fields[at])):
        symbol, target, target_pos, st = fields[at + 1 + 4 * k : at + 5 + 4 * k]
        pointers.append(Pointer(symbol, int(target), target_pos, int(st[:2], 16), int(st[2:], 16)))
    examples = tuple(re.findall(r'"([^"]*)"', gloss))
    definition = gloss.split('; "', 1)[0].strip().strip(";").strip()
    return Synset(offset, pos, lemmas, definition, examples, tuple(pointers), LEXNAMES[int(fields[1])])


def read_lines(path: Path, skipped: Counter | None = None) -> Iterator[str]:
    """The lines after the license header; a line over MAX_LINE_BYTES is an error, or with ``skipped``
    is skipped and counted (``line_too_large``; the rest of that line is read and dropped)."""
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PipelineError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB: not a WordNet data file")
    with path.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                if skipped is None:
                    raise PipelineError(f"{path}:{number}: line longer than {MAX_LINE_BYTES} bytes")
                skipped["line_too_large"] += 1
                while raw and not raw.endswith(b"\n"):
                    raw = f.readline(MAX_LINE_BYTES + 1)
                continue
            if not raw.startswith(b"  "):  # the license header's lines start with two spaces
                yield raw.decode("utf-8", errors="replace").rstrip("\n")


def synsets(pos: str | Iterable[str] = "nvar", *, root: str | None = None) -> Iterator[Synset]:
    """Every synset of the given parts of speech (``n v a r``; ``a`` includes satellites)."""
    base = wordnet_dir(root)
    for p in pos:
        path = base / FILES[p]
        for number, line in enumerate(read_lines(path), 1):
            try:
                yield parse_line(line)
            except (ValueError, IndexError) as err:
                raise PipelineError(f"{path}: synset line {number} is malformed ({err})") from None


def senses(pos: str | Iterable[str] = "nvar", *, root: str | None = None) -> dict[tuple[str, str], list[int]]:
    """(lemma, pos) -> its synsets' offsets, most frequent sense first (the ``index.*`` files' order,
    from the sense-tagged corpus counts). Lemmas in lower case with spaces."""
    base, out = wordnet_dir(root), {}
    for p in pos:
        path = base / INDEX[p]
        for number, line in enumerate(read_lines(path), 1):
            fields = line.split()
            try:
                synset_count = int(fields[2])
                out[(fields[0].replace("_", " "), p)] = [int(f) for f in fields[len(fields) - synset_count :]]
            except (ValueError, IndexError) as err:
                raise PipelineError(f"{path}: index line {number} is malformed ({err})") from None
    return out


def exceptions(pos: str, *, root: str | None = None) -> dict[str, tuple[str, ...]]:
    """An inflected form -> its base forms, from the part of speech's exception list (``noun.exc``
    ...: irregular plurals, past tenses, comparatives; ``a`` also serves satellites)."""
    base, out = wordnet_dir(root), {}
    path = base / EXCEPTIONS["a" if pos == "s" else pos]
    for number, line in enumerate(read_lines(path), 1):
        fields = line.split()
        if len(fields) < 2:
            raise PipelineError(f"{path}: exception line {number} is malformed (an inflected form and its base forms)")
        form = fields[0].replace("_", " ")  # a form on two lines (axes: ax, axis) keeps both lines' bases
        out[form] = out.get(form, ()) + tuple(f.replace("_", " ") for f in fields[1:])
    return out


# Morphy's detachment rules (WordNet's morph.c): (suffix, replacement) tried in this order.
DETACH = {
    "n": (
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}


class Morphy:
    """WordNet's morphology (morph.c): the base forms of a word for a part of speech -- the word itself,
    its entries in the exception list, what the detachment rules leave (not of a noun ending in ``ss``
    or of two letters or fewer) -- and how each was found."""

    def __init__(self, root: str | None = None):
        self.exceptions = {pos: exceptions(pos, root=root) for pos in FILES}

    def base_forms(self, word: str, pos: str) -> dict[str, str]:
        """Candidate lemma -> ``"exact"``, ``"exception"`` or ``"rule"`` (the first way that reached it)."""
        pos = "a" if pos == "s" else pos
        forms = {word: "exact"}
        for base in self.exceptions[pos].get(word, ()):
            forms.setdefault(base, "exception")
        if not (pos == "n" and (word.endswith("ss") or len(word) <= 2)):
            for suffix, ending in DETACH[pos]:
                if word.endswith(suffix) and len(word) > len(suffix):
                    forms.setdefault(word[: -len(suffix)] + ending, "rule")
        return forms


def lemmas(pos: str | Iterable[str] = "nvar", *, root: str | None = None) -> set[str]:
    """Every lemma (multi-word ones with spaces)."""
    return {lemma for s in synsets(pos, root=root) for lemma in s.lemmas}


def synonym_pairs(
    vocabulary: Iterable[str], *, pos: str = "nvar", first_sense: bool = False, root: str | None = None
) -> set[tuple[str, str]]:
    """Unordered pairs (a < b) of different one-word lemmas of one synset, both in ``vocabulary``
    (compared in lower case); ``first_sense``: only synsets that are both words' most frequent sense."""
    vocab = {w.lower() for w in vocabulary}
    ranks = senses(pos, root=root) if first_sense else {}
    pairs = set()
    for s in synsets(pos, root=root):
        p = "a" if s.pos == "s" else s.pos
        words = sorted(
            {
                w.lower()
                for w in s.lemmas
                if " " not in w
                and w.lower() in vocab
                and (not first_sense or ranks.get((w.lower(), p), [None])[0] == s.offset)
            }
        )
        pairs.update(itertools.combinations(words, 2))
    return pairs
