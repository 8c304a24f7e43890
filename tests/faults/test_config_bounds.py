"""Config values out of range and hostile YAML end in one line and exit 2 before anything runs
(issue 29): every number of a training config or a crawl recipe has a row in the one table of
``glm_common/config_bounds.py``; YAML aliases and deep nesting are refused while parsing."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest

from data_pipeline.recipe import Recipe, load_recipe
from data_pipeline.remote import RemoteReadError, open_url, retrying
from glm_common.config_bounds import BOUNDS, check_bounds
from glm_common.config_yaml import MAX_CONFIG_BYTES, MAX_DEPTH, ConfigError, read_yaml_file
from glm_dist.config.checks import validate
from glm_dist.config.loader import load_config
from glm_dist.config.schema import Config
from glm_dist.transfer.recipes import load_recipe as load_finetune_recipe
from tests.conftest import ROOT, TINY, clean_env

FINEWEB = str(ROOT / "configs/data/fineweb.yaml")
RECIPES = [str(ROOT / f"configs/data/{name}.yaml") for name in ("c4", "fineweb", "gpt3")]

# Each command of the faults, all run by one child process (imports once: ~3 s in all).
CASES = {
    "lr_inf": ["config", "show", "-c", TINY, "train.lr=inf"],
    "micro_batch": ["config", "show", "-c", TINY, f"train.micro_batch_size={10**12}"],
    "context": ["train", "-c", TINY, f"model.context_length={10**9}"],
    "read_retries": ["train", "-c", TINY, "data.read_retries=-1"],
    "tokens": [
        "config",
        "show",
        "-c",
        TINY,
        "train.micro_batch_size=65536",
        "model.context_length=8192",
        "data.seq_len=8192",
    ],
    "http_retries": ["data", "run", "-c", FINEWEB, "reader.http_retries=-1"],
    "http_timeout": ["data", "run", "-c", FINEWEB, "reader.http_read_timeout_s=0"],
}
RUN_CASES = """
import contextlib, io, json, sys
import glm_dist.cli as cli

out = {}
for name, argv in json.loads(sys.argv[1]).items():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(argv)
    out[name] = [code, err.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    """name -> (exit code, stderr) of ``glm ARGV`` for each of CASES."""
    out = tmp_path_factory.mktemp("out")
    cases = {name: argv + ([f"output={out}"] if argv[0] == "data" else []) for name, argv in CASES.items()}
    proc = subprocess.run(
        [sys.executable, "-c", RUN_CASES, json.dumps(cases)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def refused(glm, name: str) -> str:
    """The one line of a command that must stop with exit code 2."""
    code, stderr = glm[name]
    lines = [line for line in stderr.splitlines() if line.strip() and "[WARNING]" not in line]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _numeric_keys(cls: type, prefix: str = "") -> set[str]:
    """Dotted keys of every int, float or dict (Gopher n-gram thresholds) field of a schema."""
    keys, hints = set(), typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            keys |= _numeric_keys(hint, f"{prefix}{field.name}.")
        elif {int, float, dict} & ({hint} | set(typing.get_args(hint))):
            keys.add(prefix + field.name)
    return keys


def test_every_number_of_configs_and_recipes_has_one_row_in_the_table():
    config, recipe = _numeric_keys(Config), _numeric_keys(Recipe)
    assert not config & recipe
    assert set(BOUNDS) == config | recipe, (
        f"no row: {sorted((config | recipe) - set(BOUNDS))}; no such key: {sorted(set(BOUNDS) - config - recipe)}"
    )


def test_the_defaults_and_every_shipped_config_and_recipe_are_in_range():
    check_bounds(Config())
    check_bounds(Recipe())
    finetuning = ROOT / "configs/experiments/ulmfit-classifier-tiny-cpu.yaml"  # glm finetune's, not a config
    for path in sorted(set((ROOT / "configs").rglob("*.yaml")) - {finetuning} - set(map(Path, RECIPES))):
        cfg = load_config(path)
        if path.parent.name == "experiments":  # the published ones: tests/test_config.py, at their layouts
            validate(cfg)
    for path in RECIPES:
        load_recipe(path, ["output=unused"])


def test_a_learning_rate_of_inf_or_nan_is_refused_with_the_fix(glm, tmp_path):
    assert refused(glm, "lr_inf") == (
        "glm config show: error: train.lr=inf must be a finite number > 0, e.g. 0.0006 (<command line>)"
    )
    (tmp_path / "nan.yaml").write_text(f"base: {TINY}\ntrain: {{lr: .nan}}\n")
    with pytest.raises(ConfigError, match=rf"^train.lr=nan must be a finite number > 0, e.g. 0.0006 \({tmp_path}"):
        load_config(tmp_path / "nan.yaml")
    for key in ("parallel.collective_timeout_s", "eval.timeout_s", "train.grad_clip", "data.read_backoff_s"):
        with pytest.raises(ConfigError, match=rf"^{key}=inf must be a finite number"):
            load_config(TINY, [f"{key}=.inf"])


def test_sizes_no_machine_holds_are_refused_before_anything_is_allocated(glm):
    assert refused(glm, "micro_batch") == (
        f"glm config show: error: train.micro_batch_size={10**12} must be >= 1 and <= 65536, e.g. 8 (<command line>)"
    )
    assert refused(glm, "context") == (
        f"glm train: error: model.context_length={10**9} must be >= 1 and <= 16777216 (<command line>)"
    )
    assert refused(glm, "tokens").startswith(
        "glm config show: error: train.micro_batch_size=65536 x data.seq_len=8192 is 536870912 tokens per micro batch"
    )
    for key, value in [
        ("model.d_model", 2**20),
        ("model.n_layer", 10**6),
        ("model.vocab_size", 10**9),
        ("data.seq_len", 10**9),
        ("eval.batch_size", 10**9),
    ]:
        with pytest.raises(ConfigError, match=rf"^{key}={value} must be >= \d+ and <= \d+"):
            load_config(TINY, [f"{key}={value}"])


def test_negative_retries_are_refused_for_training_data_and_crawl_inputs(glm):
    assert refused(glm, "read_retries") == (
        "glm train: error: data.read_retries=-1 must be >= 0 and <= 10, e.g. 3 (<command line>)"
    )
    assert refused(glm, "http_retries") == (
        "glm data run: error: reader.http_retries=-1 must be >= 0 and <= 10, e.g. 3 (<command line>)"
    )


def test_a_crawl_read_timeout_of_zero_which_aiohttp_reads_as_none_is_refused(glm):
    assert refused(glm, "http_timeout") == (
        "glm data run: error: reader.http_read_timeout_s=0.0 must be > 0 and <= 3600, e.g. 60 (<command line>)"
    )
    with pytest.raises(ConfigError, match=r"^gopher_repetition.top_ngram_char_frac.2=1.5 must be >= 0 and <= 1"):
        load_recipe(FINEWEB, ["output=unused", "gopher_repetition.top_ngram_char_frac.2=1.5"])


def test_remote_reads_never_retry_for_ever_or_wait_without_a_timeout():
    calls = []

    def refuse():
        calls.append(1)
        raise ConnectionRefusedError("refused")

    with pytest.raises(RemoteReadError, match="gave up after 1 attempt"):
        retrying(refuse, "http://example.invalid/x", retries=-1, backoff_s=0)
    assert len(calls) == 1
    for kw in ({"retries": -1}, {"read_timeout_s": 0}, {"connect_timeout_s": float("inf")}):
        with pytest.raises(ValueError, match="finite and > 0"):
            open_url("http://example.invalid/x", **kw)


LIST_BOMB = "\n".join(
    ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    + [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    + ["logging: {tags: *i}"]
)  # 9**9 strings once expanded
DICT_BOMB = "\n".join(
    ["x0: &x0 {a: 1, b: 1}"] + [f"x{i}: &x{i} {{a: *x{i - 1}, b: *x{i - 1}}}" for i in range(1, 30)] + ["model: *x29"]
)  # 2**30 leaves


@pytest.mark.parametrize("bomb", [LIST_BOMB, DICT_BOMB], ids=["list", "dict"])
def test_a_yaml_alias_bomb_is_refused_at_once(bomb, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb + "\n")
    assert path.stat().st_size < 1024
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^{path}, line 1: YAML anchors and aliases .* are not accepted"):
        load_config(path)
    assert time.perf_counter() - start < 0.5  # 48 s and 3.7-5.6 GB before (issue 29)
    with pytest.raises(ConfigError, match=r"^override logging.tags=...: line 1: YAML anchors and aliases"):
        load_config(TINY, ["logging.tags=[&a x, *a]"])


def test_deep_nesting_is_refused_before_the_parser_recurses(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("logging:\n  tags: " + "[" * 50_000 + "]" * 50_000 + "\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^{path}, line 2: nested more than {MAX_DEPTH} levels deep"):
        load_config(path)
    with pytest.raises(ConfigError, match=rf"^override logging.tags=...: line 1: nested more than {MAX_DEPTH}"):
        load_config(TINY, ["logging.tags=" + "[" * 50_000])
    assert time.perf_counter() - start < 3  # the scanner looks 1,024 characters ahead, no further


def test_config_bytes_and_files_are_capped_over_the_whole_base_chain(tmp_path):
    (tmp_path / "big.yaml").write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml is larger than 1 MiB: not a config file"):
        load_config(tmp_path / "big.yaml")
    (tmp_path / "leaf.yaml").write_text("train: {lr: 1.0e-3}\n")
    (tmp_path / "mid.yaml").write_text(f"base: {['leaf.yaml'] * 10}\n")
    (tmp_path / "top.yaml").write_text(f"base: {['mid.yaml'] * 10}\n")  # 111 files
    with pytest.raises(ConfigError, match=r"top.yaml merges more than 64 files through base:"):
        load_config(tmp_path / "top.yaml")


def test_invalid_yaml_is_one_line_naming_the_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("train:\n  lr: [1\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "bad.yaml")
    assert "\n" not in str(err.value) and f"{tmp_path / 'bad.yaml'} is not valid YAML: line 3" in str(err.value)


def test_a_fine_tuning_recipe_and_a_task_yaml_are_read_under_the_same_rules(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(DICT_BOMB + "\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^{path}, line 1: YAML anchors and aliases"):
        load_finetune_recipe(str(path))
    assert time.perf_counter() - start < 0.5
    task = tmp_path / "task.yaml"
    task.write_text("task: demo\nprocess_results: !function utils.process\n")
    assert read_yaml_file(task, tags=True) == {"task": "demo", "process_results": None}
    with pytest.raises(ConfigError, match="is larger than 16 bytes"):
        read_yaml_file(task, max_bytes=16)
