"""roff (man(7) and mdoc(7) macros, tbl(1) tables) turned into plain text, in pure Python.

No groff, no mandoc: the data machines need not have them, and a formatter's output is laid out for
a terminal (hyphenated, justified, overstruck). This keeps what a reader of the page reads -- the
headings, the paragraphs, the tags of tagged paragraphs, the table cells, the examples line for
line -- and drops the rest: comments (``.\\"``, ``\\"``, ``\\#``), layout requests (``.RS``,
``.in``, ``.PD``, ...), font and size escapes (``\\fB``, ``\\s-1``), equations and pictures.

What roff itself does is followed where text depends on it: filled text is joined into one line per
paragraph, no-fill text (``.nf``, ``.EX``) keeps its lines, strings defined with ``.ds`` expand,
macros a page defines with ``.de`` expand with their arguments (rst2man's ``.INDENT``, tzfile(5)'s
``.q``), and ``.if``/``.ie``/``.el`` take the branch nroff would take. Expansion is bounded
(:data:`MAX_EXPANSION_LINES`), so a page cannot make the converter loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_DEPTH = 16  # nested macro calls and conditionals (deeper ones are dropped: no recursion limit hit)
MAX_EXPANSION_LINES = 200_000  # lines produced by macro expansion in one page

# Special characters (groff_char(7)) by name; an unknown name becomes nothing.
SPECIAL = {
    "em": "\u2014",
    "en": "\u2013",
    "hy": "-",
    "bu": "\u2022",
    "aq": "'",
    "dq": '"',
    "lq": "\u201c",
    "rq": "\u201d",
    "oq": "\u2018",
    "cq": "\u2019",
    "ga": "`",
    "aa": "\u00b4",
    "ha": "^",
    "ti": "~",
    "rs": "\\",
    "sl": "/",
    "ba": "|",
    "br": "|",
    "co": "\u00a9",
    "rg": "\u00ae",
    "tm": "\u2122",
    "mu": "\u00d7",
    "di": "\u00f7",
    "+-": "\u00b1",
    "<=": "\u2264",
    ">=": "\u2265",
    "!=": "\u2260",
    "==": "\u2261",
    "->": "\u2192",
    "<-": "\u2190",
    "de": "\u00b0",
    "ps": "\u00b6",
    "sc": "\u00a7",
    "dg": "\u2020",
    "lh": "\u261c",
    "rh": "\u261e",
    "at": "@",
    "sh": "#",
    "Po": "\u00a3",
    "Eu": "\u20ac",
    "ct": "\u00a2",
    "fm": "\u2032",
    "sd": "\u2033",
    "mi": "\u2212",
    "pl": "+",
    "eq": "=",
    "**": "*",
    "ul": "_",
    "ru": "_",
    "lB": "[",
    "rB": "]",
    "lC": "{",
    "rC": "}",
    "la": "\u27e8",
    "ra": "\u27e9",
    "Fo": "\u00ab",
    "Fc": "\u00bb",
    "fo": "\u2039",
    "fc": "\u203a",
    "ss": "\u00df",
    "'e": "\u00e9",
    "`e": "\u00e8",
    "'a": "\u00e1",
    ":u": "\u00fc",
    ":o": "\u00f6",
    ":a": "\u00e4",
    "~n": "\u00f1",
    "ci": "\u25cb",
    "sq": "\u25a1",
    "if": "\u221e",
    "*a": "\u03b1",
    "*b": "\u03b2",
    "*m": "\u03bc",
    "*p": "\u03c0",
    "pc": "\u00b7",
    "an": "-",
    "Do": "$",
    "Bq": "\u201e",
    "bq": "\u201a",
}
STRINGS = {"R": "\u00ae", "Tm": "\u2122", "lq": "\u201c", "rq": "\u201d", "S": "", "HF": "", "-": "-"}
SINGLE = {
    "e": "\\",
    "\\": "\\",
    "-": "-",
    " ": " ",
    "~": " ",
    "0": " ",
    "'": "\u00b4",
    "`": "`",
    ".": ".",
    "t": "\t",
}  # any other one-character escape (\& \| \^ \% \c \} ...) is nothing

ESCAPE = re.compile(
    r"""\\(?:
      f(?:\[[^\]]*\]|\(..|.)                       # font
    | \((?P<two>..)                                 # special character \(xx
    | \[(?P<name>[^\]]*)\]                          # special character \[name]
    | \*(?:\[(?P<sbr>[^\]]*)\]|\((?P<s2>..)|(?P<s1>.))   # string
    | s(?:[+-]?\(\d\d|[+-]?\[[^\]]*\]|'[^']*'|[+-]?\d\d?)  # point size
    | n[+-]?(?:\[[^\]]*\]|\(..|.)                   # number register
    | [hvwlLoDXZbxNRSHCA]'[^']*'                    # escapes with a delimited argument
    | [kz].                                         # mark, zero width
    | [\"\#].*                                      # comment to the end of the line
    | \$(?:\d|\*|@)                                 # a macro argument outside a macro
    | (?P<one>.)
    )""",
    re.X,
)
ARG = re.compile(r'"((?:[^"]|"")*)"?|((?:\\.|[^ \t\\])+)')
CONTINUATION = re.compile(r"(?<!\\)((?:\\\\)*)\\\n")
REQUEST = re.compile(r"^[.']\s*([^\s\\]+|\\\".*)?\s*(.*)$")

HEADINGS = {"SH", "SS", "Sh", "Ss"}
PARAGRAPHS = {"PP", "LP", "P", "Pp", "sp", "HP", "Lp"}
FONT_WORDS = {
    "B",
    "I",
    "SM",
    "SB",
    "Em",
    "Sy",
    "Nm",
    "Ar",
    "Fl",
    "Cm",
    "Pa",
    "Li",
    "Ql",
    "Va",
    "Fn",
    "Fa",
    "Ft",
    "Ev",
    "Er",
    "Dv",
    "Xr",
    "Ic",
    "Nd",
    "Ad",
    "An",
    "Lk",
    "Mt",
    "Ms",
    "Tn",
    "Ux",
    "Bx",
}
FONT_ALTERNATING = {"BR", "RB", "IR", "RI", "BI", "IB"}
BLOCKS_SKIPPED = {"EQ": "EN", "PS": "PE", "[": "]", "G1": "G2"}
DEFINITIONS = {"de", "de1", "dei", "am", "am1", "ami", "ig"}
# man(7)/mdoc(7) macros that only lay out (their arguments are numbers or names, not text); any other
# macro with a capital in its name prints its arguments (mdoc's .Nm, .Fl, .Ar ... are words of the text)
LAYOUT_MACROS = {
    "TH",
    "RS",
    "RE",
    "PD",
    "DT",
    "UC",
    "AT",
    "Dd",
    "Dt",
    "Os",
    "Bf",
    "Ef",
    "Bk",
    "Ek",
    "In",
    "Rs",
    "Re",
    "Ns",
    "No",
    "Sm",
    "Pf",
    "INDENT",
    "UNINDENT",
    "TE",
    "T&",
    "ME",
    "MR",
    "HY",
    "LO",
}


@dataclass
class _Page:
    """The converter's state for one page."""

    lines: list[str] = field(default_factory=list)  # finished output lines
    para: list[str] = field(default_factory=list)  # filled text of the open paragraph
    fill: bool = True
    trap: bool = False  # the next text line stands alone (a .TP tag, a .SH heading on its own line)
    strings: dict[str, str] = field(default_factory=lambda: dict(STRINGS))
    macros: dict[str, list[str]] = field(default_factory=dict)
    last_if: bool = True  # the condition of the last .ie, for .el
    url: list[str] = field(default_factory=list)  # open .UR/.MT targets
    expanded: int = 0


def roff_to_text(source: str) -> str:
    """The plain text of one roff page (see the module docstring)."""
    page = _Page()
    _run(page, CONTINUATION.sub(r"\1", source.replace("\r\n", "\n")).split("\n"), depth=0)
    _break(page)
    text = "\n".join(line.rstrip() for line in page.lines)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def unescape(text: str, strings: dict[str, str] | None = None) -> str:
    """``text`` with every roff escape replaced by what it prints (or nothing)."""
    strings = STRINGS if strings is None else strings

    def one(m: re.Match) -> str:
        if m["two"] is not None or m["name"] is not None:
            return _special(m["two"] if m["two"] is not None else m["name"])
        name = m["sbr"] if m["sbr"] is not None else m["s2"] if m["s2"] is not None else m["s1"]
        if name is not None:
            return strings.get(name, "")
        return SINGLE.get(m["one"], "") if m["one"] is not None else ""

    return ESCAPE.sub(one, text)


def _special(name: str) -> str:
    if re.fullmatch(r"u[0-9A-Fa-f]{4,6}", name):  # \[u00E9]
        code = int(name[1:], 16)
        return chr(code) if code <= 0x10FFFF else ""
    return SPECIAL.get(name, "")


def split_args(rest: str) -> list[str]:
    """A request's arguments: space-separated, ``"quoted with spaces"``, ``""`` a quote inside quotes."""
    return [m[1].replace('""', '"') if m[1] is not None else m[2] for m in ARG.finditer(rest)]


def _run(page: _Page, lines: list[str], *, depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line[:1] in (".", "'"):
            i = _request(page, lines, i, line, depth=depth)
        else:
            _text_line(page, line)


def _text_line(page: _Page, line: str) -> None:
    if not line.strip():
        _blank(page)
        return
    if page.fill and line[:1] in (" ", "\t"):  # leading space breaks the line in fill mode
        _break(page)
    _text(page, unescape(line, page.strings))


def _text(page: _Page, text: str) -> None:
    """Add text: one more line of the paragraph (fill), or a line of its own (no-fill, a trap)."""
    if page.trap:
        _break(page)
        page.lines.append(text.strip())
        page.trap = False
    elif page.fill:
        if text.strip():
            page.para.append(text.strip())
    else:
        page.lines.append(text)


def _break(page: _Page) -> None:
    if page.para:
        page.lines.append(" ".join(page.para))
        page.para = []


def _blank(page: _Page) -> None:
    _break(page)
    if page.lines and page.lines[-1] != "":
        page.lines.append("")


def _request(page: _Page, lines: list[str], i: int, line: str, *, depth: int) -> int:
    """Carry out one control line; return the index of the next unread line."""
    m = REQUEST.match(line)
    name, rest = (m[1] or "", m[2]) if m else ("", "")
    if not name or name.startswith('\\"'):
        return i  # an empty request or a comment line
    if name in DEFINITIONS:
        return _define(page, lines, i, name, split_args(rest))
    if name in ("if", "ie", "el"):
        return _conditional(page, lines, i, name, rest, depth=depth)
    if name == "TS":
        return _table(page, lines, i)
    if name in BLOCKS_SKIPPED:
        return _skip_until(lines, i, BLOCKS_SKIPPED[name])
    if name == "ds" or name == "ds1":
        key, _, value = rest.partition(" ")
        page.strings[key] = unescape(value[1:] if value.startswith('"') else value, page.strings)
        return i
    if name in page.macros:
        _expand(page, page.macros[name], split_args(rest), depth=depth)
        return i
    _macro(page, name, split_args(rest))
    return i


def _macro(page: _Page, name: str, args: list[str]) -> None:
    """The man(7) and mdoc(7) macros that carry text or breaks; the rest only lays out."""
    text = [unescape(a, page.strings) for a in args]
    if name in HEADINGS:  # a line of its own between blank lines (without arguments: the next text line)
        _blank(page)
        if text:
            page.lines += [" ".join(text), ""]
        else:
            page.trap = True
    elif name in PARAGRAPHS:
        _blank(page)
    elif name in ("TP", "TQ"):
        (_blank if name == "TP" else _break)(page)
        page.trap = True
    elif name == "IP":
        _blank(page)
        tag = text[0].strip() if text else ""
        if len(tag) > 3:
            page.lines.append(tag)
        elif tag:
            page.para.append(tag)
    elif name in ("br", "Bl", "El", "It", "YS", "SY", "Dl", "D1", "Bd", "Ed"):
        _break(page)
        if name in ("It", "SY", "Dl", "D1") and text:
            _text(page, " ".join(t for t in text if not t.startswith("-") or name != "It"))
    elif name in ("nf", "EX", "fi", "EE"):
        _break(page)
        page.fill = name in ("fi", "EE")
    elif name in FONT_ALTERNATING:
        _text(page, "".join(text))
    elif name in ("UR", "MT"):
        page.url.append(text[0] if text else "")
    elif name in ("UE", "ME"):
        target = page.url.pop() if page.url else ""
        _text(page, f"<{target}>" + "".join(text) if target else "".join(text))
    elif name == "OP":
        _text(page, "[" + " ".join(text) + "]")
    elif (name in FONT_WORDS or (name[:1].isupper() and name not in LAYOUT_MACROS)) and text:
        _text(page, " ".join(text))


def _define(page: _Page, lines: list[str], i: int, name: str, args: list[str]) -> int:
    """``.de NAME [END]`` ... ``..``: keep the body (``.am`` appends); ``.ig`` skips to ``..``."""
    end = "." + (args[1] if len(args) > 1 else ".") if name != "ig" else "." + (args[0] if args else ".")
    body = []
    while i < len(lines) and lines[i].strip() != end and lines[i].strip() != "..":
        body.append(lines[i])
        i += 1
    if name != "ig" and args:
        page.macros[args[0]] = (page.macros.get(args[0], []) if name.startswith("am") else []) + body
    return i + 1


def _expand(page: _Page, body: list[str], args: list[str], *, depth: int) -> None:
    """A page's own macro called with ``args``: ``\\$1``... and ``\\$*`` substituted, ``\\\\`` -> ``\\``."""
    page.expanded += len(body)
    if page.expanded > MAX_EXPANSION_LINES:
        return

    def arg(m: re.Match) -> str:
        key = m[1]
        if key in ("*", "@"):
            return " ".join(f'"{a}"' if " " in a and key == "@" else a for a in args)
        n = int(key)
        return args[n - 1] if 0 < n <= len(args) else ""

    expanded = [re.sub(r"\\\\\$(\d|\*|@)", arg, line).replace("\\\\", "\\") for line in body]
    _run(page, expanded, depth=depth + 1)


def _conditional(page: _Page, lines: list[str], i: int, name: str, rest: str, *, depth: int) -> int:
    """``.if COND BODY``, ``.ie COND BODY`` / ``.el BODY``; a BODY opening ``\\{`` runs to its ``\\}``."""
    if name == "el":
        taken, body = not page.last_if, rest
    else:
        taken, body = _condition(rest, page.strings)
        if name == "ie":
            page.last_if = taken
    body = body.lstrip()
    block = [body]
    if body.startswith("\\{"):
        block = [body[2:].lstrip()]
        open_braces = 1 + body[2:].count("\\{") - body[2:].count("\\}")
        while i < len(lines) and open_braces > 0:
            open_braces += lines[i].count("\\{") - lines[i].count("\\}")
            block.append(lines[i])
            i += 1
    if taken:
        _run(page, [re.sub(r"\\[{}]", "", line) for line in block if line], depth=depth + 1)
    return i


def _condition(rest: str, strings: dict[str, str]) -> tuple[bool, str]:
    """(what nroff decides, the body after the condition). Unknown conditions are false."""
    rest = rest.lstrip()
    negate = rest.startswith("!")
    rest = rest[1:] if negate else rest
    m = re.match(r"([ntoev])(?=\s|\\\{)|(['\"|/])(.*?)\2(.*?)\2|\\n(?:\(\.g|\[\.g\])|(\d+)(?=\s)|([dr])\s*(\S+)", rest)
    if not m:
        return False, rest.split(None, 1)[1] if " " in rest else ""
    if m[1]:
        value = m[1] == "n"
    elif m[2]:
        value = unescape(m[3], strings) == unescape(m[4], strings)
    elif m[5]:
        value = int(m[5]) > 0
    elif m[6]:
        value = m[6] == "d" and m[7] in strings
    else:
        value = True  # \n(.g: this is groff
    return value != negate, rest[m.end() :]


def _skip_until(lines: list[str], i: int, end: str) -> int:
    while i < len(lines) and not re.match(rf"^[.']\s*{re.escape(end)}\b", lines[i]):
        i += 1
    return i + 1


def _table(page: _Page, lines: list[str], i: int) -> int:
    """A tbl(1) table (``.TS`` ... ``.TE``): options and format lines skipped, each data row one line
    with its cells two spaces apart; ``T{`` ... ``T}`` text blocks joined into their cell."""
    _break(page)
    tab = "\t"
    i, tab = _table_format(lines, i, tab)
    row = ""
    while i < len(lines):
        line = lines[i]
        i += 1
        if re.match(r"^[.']\s*TE\b", line):
            break
        if re.match(r"^[.']\s*T&", line):
            i, _ = _table_format(lines, i, tab)
            continue
        if line[:1] in (".", "'"):  # a request inside a text block (.sp, .br)
            continue
        if line.strip() in ("_", "=", "\\_"):
            continue
        row = f"{row} {line}" if row else line
        if row.count("T{") > row.count("T}"):
            continue
        cells = [unescape(c.replace("T{", "").replace("T}", ""), page.strings).strip() for c in row.split(tab)]
        page.lines.append("  ".join(c for c in cells if c))
        row = ""
    page.lines.append("")
    return i


def _table_format(lines: list[str], i: int, tab: str) -> tuple[int, str]:
    """Skip a table's options (``...;``) and format lines (the last ends in ``.``); return the tab."""
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if line.endswith(";"):
            found = re.search(r"tab\s*\((.)\)", line)
            tab = found[1] if found else tab
            continue
        if line.endswith("."):
            break
    return i, tab
