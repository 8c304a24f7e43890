"""docs/cli.md and README.md's command table are what ``glm_dist.cli_doc`` makes of the parsers now.

When a test here fails after a change to a parser, run ``python -m glm_dist.cli_doc --write`` and
commit docs/cli.md and README.md with the change.
"""

from __future__ import annotations

import argparse

import pytest

from glm_dist import cli, cli_doc

REGENERATE = "run `python -m glm_dist.cli_doc --write` and commit docs/cli.md and README.md"


@pytest.fixture(scope="module")
def root():
    return cli_doc.parsers()


def test_docs_cli_md_and_the_readme_table_are_current():
    found = cli_doc.stale()
    assert not found, f"stale: {', '.join(found)}; {REGENERATE}"


def test_every_command_has_a_section_in_docs_cli_md_and_a_row_in_the_readme(root):
    names = [c.name for c in cli_doc.leaves(root)]
    # the five the README's old command list left out, and the two parsed outside glm's parser
    assert {
        "glm checkpoint convert",
        "glm data index",
        "glm data gettext",
        "glm data tagging",
        "glm data token-tasks",
        "glm launch",
        "glm slurm",
    } <= set(names)
    page = cli_doc.CLI_MD.read_text(encoding="utf-8")
    readme = cli_doc.README.read_text(encoding="utf-8")
    for name in names:
        assert f"\n## {name}\n" in page, f"docs/cli.md has no section for {name}; {REGENERATE}"
        assert f"| [`{name}`](docs/cli.md#{name.replace(' ', '-')}) |" in readme, (
            f"README.md's command table has no row for {name}; {REGENERATE}"
        )


def test_every_argument_of_every_command_is_in_its_section(root):
    page = cli_doc.CLI_MD.read_text(encoding="utf-8")
    for command in cli_doc._commands(root):
        section = page.split(f"\n## {command.name}\n", 1)[1].split("\n## ", 1)[0]
        for action in command.parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in section or f", {option}" in section, (command.name, option)


def test_the_output_ignores_the_terminal_width_and_the_environment(monkeypatch):
    first = cli_doc.cli_markdown()
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert cli_doc.cli_markdown() == first
    # defaults read from the environment say so
    assert "`1` (`$WORLD_SIZE` when set)" in first and "`glm` (`$SLURM_JOB_ID` when set)" in first


def test_a_new_argument_makes_the_reference_stale(monkeypatch):
    real = cli._parser

    def with_one_more() -> argparse.ArgumentParser:
        parser = real()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["plan"].add_argument("--new-option", help="not documented yet")
        sub.add_parser("brand-new", help="a command nobody documented")
        return parser

    monkeypatch.setattr(cli, "_parser", with_one_more)
    found = cli_doc.stale()
    assert found == ["docs/cli.md", "README.md (command table)"], found
    text = cli_doc.cli_markdown()
    assert "`--new-option NEW_OPTION` |  | not documented yet |" in text and "\n## glm brand-new\n" in text
