"""The documents the code cites are in the repository and say what is cited.

A citation is ``docs/NAME.md, decision N`` (also ``decisions N and M``), which must name a numbered
heading ``## N. ...`` (any level) of that file, or ``docs/NAME.md#section``, which must name one of
its headings by its GitHub anchor. Every relative link in README.md and docs/ must reach a file
(and a heading, with ``#``). The design documents that used to live outside the repository are no
longer cited by name. Pure text: no import of the library.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".sbatch", ".toml", ".cfg", ".txt"}
SKIP_ANYWHERE = {"__pycache__", "wandb", "node_modules"}
SKIP_AT_ROOT = {"runs", "data", "build", "slurm-logs", "wheelhouse", "docs"}  # docs/ is checked as the target

# "docs/architecture.md, decision 11", "docs/architecture.md\n# decisions 5 and 12", "... decisions 2, 10"
DECISION = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)[\s#,;:(]*decisions?\s+(\d+(?:\s*(?:,|and)\s*\d+)*)")
MENTION = re.compile(r"(?<![\w/.-])docs/([\w-]+\.md)(?:#([\w-]+))?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
OLD_NAMES = re.compile(r"\b(?:ARCHITECTURE|REFERENCE)\.md\b")
NUMBERED = re.compile(r"#{1,6}\s+(\d+)\.\s")


def source_files() -> list[Path]:
    """The repository's text files outside docs/, build and run outputs, and this file (whose
    examples cite what does not exist on purpose)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        top = Path(folder) == ROOT
        dirs[:] = sorted(
            d
            for d in dirs
            if not (d.startswith(".") or d in SKIP_ANYWHERE or d.endswith(".egg-info") or (top and d in SKIP_AT_ROOT))
        )
        found += [Path(folder) / f for f in sorted(files) if Path(f).suffix in SUFFIXES]
    return [p for p in found if p != Path(__file__).resolve()]


def headings(path: Path) -> list[str]:
    """The Markdown headings of ``path`` (the ``#`` marks kept), outside fenced code."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6}\s", line):
            out.append(line.strip())
    return out


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def decision_numbers(path: Path) -> list[int]:
    return [int(m.group(1)) for h in headings(path) if (m := NUMBERED.match(h))]


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def citation_problems(text: str, where: str, docs: Path) -> list[str]:
    """What in ``text`` cites a file, decision or section that ``docs`` lacks."""
    problems = []
    for m in MENTION.finditer(text):
        name, section = m.groups()
        target = docs / name
        if not target.is_file():
            problems.append(f"{where}:{line_of(text, m.start())}: docs/{name} does not exist")
        elif section and section not in {anchor(h) for h in headings(target)}:
            problems.append(f"{where}:{line_of(text, m.start())}: docs/{name} has no heading #{section}")
    for m in DECISION.finditer(text):
        target = docs / m.group(1)
        have = set(decision_numbers(target)) if target.is_file() else set()
        for number in map(int, re.findall(r"\d+", m.group(2))):
            if number not in have:
                problems.append(
                    f"{where}:{line_of(text, m.start())}: docs/{m.group(1)} has no heading "
                    f"'{number}. ...' (decision {number})"
                )
    return problems


def test_every_citation_names_a_decision_or_section_of_a_file_in_docs():
    problems, decisions = [], 0
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        decisions += len(DECISION.findall(text))
        problems += citation_problems(text, str(path.relative_to(ROOT)), ROOT / "docs")
    assert not problems, "\n".join(problems)
    assert decisions >= 10, f"only {decisions} decision citations found: is the scan looking in the right place?"


def test_a_missing_decision_or_section_is_reported():
    docs = ROOT / "docs"
    text = (
        "x = 1  # docs/architecture.md, decision 999\n"
        '"""(docs/architecture.md\ndecisions 5 and 998)"""\n'
        "# docs/reference.md#no-such-section\n# docs/no-such-file.md\n"
    )
    problems = citation_problems(text, "f.py", docs)
    assert any("f.py:1:" in p and "decision 999" in p for p in problems), problems
    assert any("f.py:2:" in p and "decision 998" in p for p in problems), problems
    assert not any("decision 5)" in p for p in problems), problems
    assert any("#no-such-section" in p for p in problems) and any("no-such-file.md" in p for p in problems)


def test_decision_numbers_are_unique_and_every_section_a_heading_once():
    numbers = decision_numbers(ROOT / "docs" / "architecture.md")
    assert numbers == sorted(set(numbers)) and numbers[:1] == [1], numbers
    for path in (ROOT / "docs").glob("*.md"):
        anchors = [anchor(h) for h in headings(path)]
        assert len(anchors) == len(set(anchors)), f"{path.name}: two headings share an anchor"


def test_links_in_readme_and_docs_reach_files_and_headings():
    problems = []
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for m in LINK.finditer(text):
            url = m.group(1)
            if re.match(r"[a-z][\w+.-]*:", url):  # http:, https:, mailto:
                continue
            rel, _, section = url.partition("#")
            target = (page.parent / rel).resolve() if rel else page
            where = f"{page.relative_to(ROOT)}:{line_of(text, m.start())}"
            if not target.exists():
                problems.append(f"{where}: {url} does not exist")
            elif section and target.suffix == ".md" and section not in {anchor(h) for h in headings(target)}:
                problems.append(f"{where}: {url}: no heading #{section}")
    assert not problems, "\n".join(problems)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/architecture.md" in readme, "README.md does not link docs/architecture.md"


def test_no_citation_of_the_documents_outside_the_repository_remains():
    found = []
    for path in source_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [
            f"{path.relative_to(ROOT)}:{line_of(text, m.start())}: {m.group(0)}" for m in OLD_NAMES.finditer(text)
        ]
    assert not found, "cite docs/architecture.md or docs/reference.md instead:\n" + "\n".join(found)


def test_readme_is_short_and_links_every_docs_page():
    """README.md (at most 200 lines, the two commands at the top) and docs/index.md reach every page."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = readme.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into a docs/ page"
    top = "\n".join(lines[:15])
    assert "bash launch/quickstart.sh" in top and "bash launch/test.sh" in top, "the two commands left the top"
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not list {page.name}"
