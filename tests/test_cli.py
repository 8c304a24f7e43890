"""The command table: every ``glm`` command is a module with its arguments and its run function, dispatched
by name, and a run imports only the module of the command it runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from glm_dist import cli, cli_doc, commands
from tests.conftest import ROOT, TINY, clean_env


def test_the_table_and_the_parser_list_the_same_commands_each_with_its_parts():
    leaves = [c.name.removeprefix("glm ") for c in cli_doc.leaves(cli_doc._walk("glm", "", cli._parser()))]
    assert leaves == [*commands.COMMANDS, *commands.OWN_OPTIONS]
    for name in commands.COMMANDS:
        module = commands.load(name)
        assert isinstance(module.HELP, str) and module.HELP, name
        assert callable(module.add_arguments) and callable(module.run), name
    for name in commands.OWN_OPTIONS:
        assert callable(commands.load(name).main), name


def test_the_parser_of_one_command_parses_its_line_as_the_full_parser_does():
    argv = ["data", "tokenize", "-c", TINY, "--task", "3", "data.vocab_size=512"]
    assert commands.named(argv) == "data tokenize"
    assert vars(cli._parser("data tokenize").parse_args(argv)) == vars(cli._parser().parse_args(argv))
    assert commands.named(["data", "--help"]) is None and commands.named(["bogus"]) is None


RUN = """
import contextlib, io, json, sys
from glm_dist import cli

out = {}
for argv in json.loads(sys.argv[1]):
    before = {m for m in sys.modules if m.startswith("glm_dist.commands.")}
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    loaded = sorted({m for m in sys.modules if m.startswith("glm_dist.commands.")} - before)
    out[" ".join(argv[:2])] = [code, err.getvalue(), loaded]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs():
    """``glm config keys`` and ``glm data mix -c TINY`` run one after the other in a fresh process:
    (exit code, stderr, the command modules each imported)."""
    argvs = [["config", "keys"], ["data", "mix", "-c", TINY]]
    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(argvs)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_a_run_imports_the_module_of_its_command_alone(runs):
    assert runs["config keys"][0] == 0 and runs["config keys"][2] == ["glm_dist.commands.config_keys"]
    assert runs["data mix"][2] == ["glm_dist.commands.data_mix"]


def test_glm_data_mix_refuses_a_config_without_a_mixture_in_one_line(runs):
    code, err, _ = runs["data mix"]
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("glm data mix: error: data.mixture is empty"), err
