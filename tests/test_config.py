"""Config tree: inheritance, overrides, strictness, cross-field checks, DeepSpeed JSON."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import yaml

from glm_dist.commands import config_keys
from glm_dist.config.checks import model_config, validate
from glm_dist.config.deepspeed_json import deepspeed_config
from glm_dist.config.loader import ConfigError, load_config, source_of, to_dict
from glm_dist.families.registry import FAMILIES
from glm_dist.objectives.registry import OBJECTIVES
from tests.conftest import ROOT, TINY


def write(path, text):
    path.write_text(text)
    return path


def test_base_chain_is_merged_with_child_winning(tmp_path):
    write(tmp_path / "a.yaml", "train:\n  lr: 1.0e-3\n  max_steps: 10\nmodel:\n  flavor: tiny\n")
    write(tmp_path / "b.yaml", "base: a.yaml\ntrain:\n  lr: 2.0e-3\n")
    child = write(tmp_path / "c.yaml", "base: [b.yaml]\ntrain:\n  warmup_steps: 3\n")
    cfg = load_config(child)
    assert (cfg.train.lr, cfg.train.max_steps, cfg.train.warmup_steps) == (2e-3, 10, 3)
    assert source_of(cfg, "train.lr").endswith("b.yaml")
    assert source_of(cfg, "train.max_steps").endswith("a.yaml")


def test_command_line_overrides_are_typed_and_win():
    cfg = load_config(TINY, ["train.lr=3e-4", "train.max_steps=7", "logging.tags=[a, b]", "model.sparse_window=16"])
    assert cfg.train.lr == 3e-4 and cfg.train.max_steps == 7
    assert cfg.logging.tags == ["a", "b"] and cfg.model.options.sparse_window == 16
    assert source_of(cfg, "train.lr") == "<command line>"


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    bad = write(tmp_path / "bad.yaml", f"base: {TINY}\ntrain:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key 'train.learning_rate' in .*bad.yaml"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"unknown section|unknown key 'trian'"):
        load_config(TINY, ["trian.lr=1"])


def test_wrong_type_names_the_key_and_the_file(tmp_path):
    bad = write(tmp_path / "bad.yaml", "train:\n  max_steps: many\n")
    with pytest.raises(ConfigError, match=r"'train.max_steps' = 'many' in .*bad.yaml: expected int"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"'train.precision' = 'fp8' in <command line>: must be one of"):
        load_config(TINY, ["train.precision=fp8"])
    with pytest.raises(ConfigError, match=r"'parallel.zero_stage' = True .*expected int"):
        load_config(TINY, ["parallel.zero_stage=true"])


def test_missing_base_file_is_reported(tmp_path):
    bad = write(tmp_path / "bad.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere.yaml \(base of .*bad.yaml\) does not exist"):
        load_config(bad)


def test_heads_must_divide_width_with_numbers_and_source():
    cfg = load_config(TINY, ["model.n_head=5"])
    with pytest.raises(
        ConfigError,
        match=r"n_head=5 must divide model.d_model=128 \(d_model / n_head = 25.60; "
        r"set in <command line>, flavor 'tiny'\)",
    ):
        validate(cfg)


def test_global_batch_must_equal_micro_times_accum_times_data_parallel():
    cfg = load_config(TINY, ["train.global_batch_size=64", "train.micro_batch_size=8", "train.grad_accum_steps=2"])
    validate(cfg, world_size=4)
    with pytest.raises(
        ConfigError,
        match=r"global_batch_size=64 .* != micro_batch_size 8 x grad_accum_steps 2 x "
        r"data-parallel size 2 = 32; change grad_accum_steps to 4",
    ):
        validate(cfg, world_size=2)


def test_other_cross_field_checks():
    with pytest.raises(ConfigError, match="seq_len=512 exceeds model.context_length=256"):
        validate(load_config(TINY, ["data.seq_len=512"]))
    with pytest.raises(ConfigError, match="offload_optimizer needs parallel.zero_stage >= 1"):
        validate(load_config(TINY, ["parallel.zero_stage=0", "parallel.offload_optimizer=true"]))
    with pytest.raises(ConfigError, match="unknown GPT flavor 'gpt2-huge'"):
        validate(load_config(TINY, ["model.flavor=gpt2-huge"]))


def test_deepspeed_json_is_derived_from_the_tree():
    cfg = load_config(
        TINY,
        [
            "train.micro_batch_size=4",
            "train.grad_accum_steps=3",
            "parallel.zero_stage=3",
            "train.precision=bf16",
            "train.grad_clip=0.5",
        ],
    )
    ds = deepspeed_config(cfg, dp_size=2)
    assert ds["train_batch_size"] == 24 and ds["gradient_accumulation_steps"] == 3
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"] and ds["gradient_clipping"] == 0.5
    assert not deepspeed_config(load_config(TINY, ["train.precision=bf16-autocast"]))["bf16"]["enabled"]


def test_lamb_is_refused_where_deepspeed_would_flatten_its_layers():
    with pytest.raises(ConfigError, match="train.optimizer=lamb needs parallel.zero_stage=0"):
        validate(load_config(TINY, ["train.optimizer=lamb", "parallel.zero_stage=1"]))
    validate(load_config(TINY, ["train.optimizer=lamb", "parallel.zero_stage=0", "train.precision=bf16-autocast"]))


def test_every_published_recipe_validates_at_its_cluster_layout():
    from pathlib import Path

    recipes = sorted((Path(TINY).parents[0] / "published").glob("*.yaml"))
    assert len(recipes) >= 6
    for path in recipes:
        cfg = load_config(path)
        t, p = cfg.train, cfg.parallel
        model_parallel = p.pipeline_stages * p.tensor_parallel
        world = t.global_batch_size // (t.micro_batch_size * t.grad_accum_steps) * model_parallel
        validate(cfg, world_size=world)
        with pytest.raises(ConfigError, match="global_batch_size"):
            validate(cfg, world_size=world + model_parallel)


def test_t5_inverse_sqrt_schedule_is_flat_during_warmup_then_decays():
    from pathlib import Path

    from glm_dist.train.schedule import lr_at

    t = load_config(Path(TINY).parent / "published/t5-base.yaml").train
    assert [lr_at(s, t) for s in (0, 9999)] == [0.01, 0.01]  # 1 / sqrt(10k)
    assert lr_at(39999, t) == pytest.approx(0.005) and lr_at(4 * 40000 - 1, t) == pytest.approx(0.0025)
    assert t.optimizer == "adafactor"


def test_every_published_size_has_a_recipe_with_a_layout():
    """configs/experiments/published/ holds a recipe for every size with a published parameter count."""
    from pathlib import Path

    from glm_dist.families.registry import FAMILIES, published_flavors

    recipes = [load_config(p) for p in (Path(TINY).parents[0] / "published").glob("*.yaml")]
    covered = {r.model.flavor for r in recipes}
    sizes = {name for family in FAMILIES for name in published_flavors(family)}
    assert sizes - covered == set()


AUTO = """
import json, sys
from glm_dist.config.loader import load_config
from glm_dist.ops.hardware import native_bf16
print(json.dumps([load_config(sys.argv[1]).train.precision, *native_bf16()]))
"""


def test_auto_precision_is_bf16_only_where_the_cpu_multiplies_bf16_natively():
    """The tiny CPU configs say auto. With oneDNN capped at AVX2 (bf16 then emulated: ~2 GFLOP/s
    against ~200 in fp32, measured) it is fp32; uncapped, bf16 exactly where the CPU has AMX or
    AVX512-BF16 (and the same on every load: two processes of one run resolve it alike)."""
    import json
    import subprocess
    import sys

    import torch

    from tests.conftest import ROOT, clean_env

    def resolve(**env):
        proc = subprocess.run(
            [sys.executable, "-c", AUTO, TINY],
            cwd=ROOT,
            env=clean_env() | env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    capped = resolve(ONEDNN_MAX_CPU_ISA="AVX2")
    assert capped[:2] == ["fp32", False] and ("ONEDNN_MAX_CPU_ISA" in capped[2] or "neither" in capped[2]), capped
    native = any(getattr(torch.cpu, probe)() for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"))
    first = resolve(ONEDNN_MAX_CPU_ISA="ALL")  # oneDNN's default: every ISA the CPU has
    assert resolve(ONEDNN_MAX_CPU_ISA="ALL") == first, first
    assert first[:2] == (["bf16", True] if native else ["fp32", False]), first
    assert load_config(TINY, ["train.precision=fp32"]).train.precision == "fp32"  # an explicit choice stays


def test_what_config_show_prints_loads_back_to_the_same_config(tmp_path):
    """Every experiment's resolved config, written out whole (defaults included, as ``glm config show``
    prints it), reads back unchanged: a default of a key the family does not use (``model.dropout``
    of AWD-LSTM and GloVe) is not a setting."""
    recipes = {"ulmfit-classifier-tiny-cpu.yaml"}  # a glm finetune recipe, not a training config
    for path in sorted(p for p in (ROOT / "configs/experiments").glob("*.yaml") if p.name not in recipes):
        tree = to_dict(load_config(path))
        shown = tmp_path / path.name
        shown.write_text(yaml.safe_dump(tree, sort_keys=False))
        again = load_config(shown)
        model_config(again)
        assert to_dict(again) == tree, path.name


def test_config_keys_lists_every_familys_and_objectives_own_keys_with_who_takes_them(capsys):
    assert config_keys.run(argparse.Namespace()) == 0
    lines = capsys.readouterr().out.splitlines()
    helps = {line.split(":")[0]: help.strip() for line, help in zip(lines[::2], lines[1::2])}
    assert "model.options" not in helps and "objective.options" not in helps  # the holders, not keys
    for section, owners in (("model", FAMILIES), ("objective", OBJECTIVES)):
        for name, owner in owners.items():
            for f in dataclasses.fields(owner.options if section == "model" else owner.Options):
                users = helps[f"{section}.{f.name}"].split(": ")[0].split(", ")
                assert name in users, (section, f.name, users)
