"""One row per family and per objective (docs/architecture.md, decision 10): no other module of the
library tests a family's or an objective's name, and every row is complete."""

from __future__ import annotations

import dataclasses
import importlib
import io
import tokenize
from pathlib import Path

import pytest
import torch

from data_pipeline.tokenize.profiles import PROFILES
from glm_dist.families.registry import FAMILIES, build_model, resolve
from glm_dist.objectives.registry import OBJECTIVES
from tests.conftest import ROOT

LIB = ROOT / "glm_dist"
SCANNED = (ROOT / "glm_dist", ROOT / "data_pipeline")
# files that may name a family or objective, or read another package's family options, and why
ALLOWED_FILES = {
    "glm_dist/families/registry.py": "gathers the rows by name",
    "glm_dist/objectives/registry.py": "gathers the objectives by name",
    "glm_dist/config/schema.py": "the config's defaults name a family and an objective",
    "data_pipeline/tokenize/profiles.py": "tokenizer profiles (bert, roberta, albert, t5, xlnet) named as the "
    "tokenizers were published; the family's row names its profile",
    "glm_dist/objectives/plm.py": "XLNet's PLM reads reuse_len / bi_data from the model config its options() is "
    "handed (it trains xlnet alone, checked first)",
    "glm_dist/objectives/cvt_translation.py": "CVT translation refuses a CoVe config without its cvt_* decoders and "
    "decodes with their beam (it trains cove alone, checked first)",
}
# family options that are also ordinary words elsewhere, which a name scan cannot tell apart
COMMON_WORDS = {"tags": "also W&B's run tags (logging.tags) and the tagging data's per-token tags"}


def _home(path: Path) -> str:
    """``families/<family>`` for a file of a family package, else the path from the root."""
    rel = path.relative_to(ROOT).as_posix()
    parts = rel.split("/")
    return "/".join(parts[:3]) if parts[:2] == ["glm_dist", "families"] and len(parts) == 4 else rel


def _may_name(path: Path) -> bool:
    """A family package, an objective's file or an allowed file may name families and objectives."""
    rel = path.relative_to(ROOT).as_posix()
    return _home(path) != rel or rel in {f"glm_dist/objectives/{name}.py" for name in OBJECTIVES} | set(ALLOWED_FILES)


def family_options() -> dict[str, set[str]]:
    """Each family option's name -> the family packages at home with it: those whose rows' model config
    carries the field (GPT-1 is a GPT config, so GPT's options are at home in both)."""
    homes: dict[str, set[str]] = {}
    for spec_file in sorted((LIB / "families").glob("*/spec.py")):
        package = spec_file.parent.relative_to(ROOT).as_posix()
        for spec in importlib.import_module(f"glm_dist.families.{spec_file.parent.name}.spec").FAMILIES.values():
            config_fields = {f.name for f in dataclasses.fields(type(next(iter(spec.flavors.values())).cfg))}
            for other in FAMILIES.values():
                for f in dataclasses.fields(other.options):
                    if f.name in config_fields and f.name not in COMMON_WORDS:
                        homes.setdefault(f.name, set()).add(package)
    return homes


def quoted_names(
    source: str, options: dict | None = None, home: str = "", *, names: bool = True
) -> list[tuple[int, str]]:
    """(line, name) of every string literal that is exactly a family or objective name (unless not ``names``),
    and of every string literal or attribute that is a family option (``options``: name -> its homes) outside
    its homes."""
    names, options = (set(FAMILIES) | set(OBJECTIVES)) if names else set(), options or {}
    foreign = {name for name, homes in options.items() if home not in homes}
    found, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            body = tok.string.lstrip("rbuRBU")
            text = body.strip("'\"")
            if body[:1] in "'\"" and len(body) == len(text) + 2 and (text in names or text in foreign):
                found.append((tok.start[0], text))
        elif tok.type == tokenize.NAME and tok.string in foreign and previous == ".":
            found.append((tok.start[0], tok.string))
        previous = tok.string
    return found


def test_no_module_outside_the_registries_tests_a_family_or_objective_name():
    options = family_options()
    paths = [
        path
        for root in SCANNED
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in ALLOWED_FILES
    ]
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name!r}"
        for path in paths
        for line, name in quoted_names(path.read_text(), options, _home(path), names=not _may_name(path))
    ]
    assert not offenders, (
        "family / objective names and family options outside their packages and registries "
        "(ask the family's row instead):\n" + "\n".join(offenders)
    )


def test_the_scan_catches_what_it_is_for():
    assert quoted_names('if meta["model_family"] == "electra":\n    x = {"t5": 1, \'clm\': 2}\n') == [
        (1, "electra"),
        (2, "t5"),
        (2, "clm"),
    ]
    assert quoted_names('"""the gpt family"""\nname = "gpt2-small"\n') == []
    options = family_options()
    assert {"mem_len", "sparse_window", "cvt_beam"} <= set(options)
    leak = 'm = getattr(model_cfg, "mem_len", 0)\nif cfg.model.cvt_beam > 1 and x.sparse_window:\n    pass\n'
    assert quoted_names(leak, options, "glm_dist/train/loop.py") == [
        (1, "mem_len"),
        (2, "cvt_beam"),
        (2, "sparse_window"),
    ]
    assert quoted_names(leak, options, "glm_dist/families/gpt") == [(1, "mem_len"), (2, "cvt_beam")]
    assert quoted_names("mem_len = 4\n", options, "glm_dist/train/loop.py") == []  # a local name is no leak
    assert quoted_names('x = "xlnet"\n', options, "glm_dist/families/xlnet", names=False) == []


def test_every_family_row_is_complete_and_builds():
    for name, spec in FAMILIES.items():
        assert spec.objectives and all(o in OBJECTIVES for o in spec.objectives), name
        assert spec.tokenizer_profile in PROFILES, name
        if spec.pipeline:
            assert set(spec.pipeline.objectives) <= set(spec.objectives), name
            assert callable(resolve(spec.pipeline.build)) and callable(resolve(spec.pipeline.rename)), name
        if spec.hf:
            assert callable(resolve(f"{spec.hf}:export_hf")), name
        flavor = next(iter(spec.flavors.values()))
        with torch.device("meta"):
            assert sum(p.numel() for p in build_model(name, flavor.cfg).parameters()) > 0, name


def test_objectives_keep_their_rng_streams():
    """A salt names an objective's noise stream: changing one changes every resumed run's masks."""
    salts = {name: o.salt for name, o in OBJECTIVES.items()}
    assert len(set(salts.values())) == len(salts)
    assert salts["clm"] == 1000 and salts["mlm"] == 1001 and salts["plm"] == 1007


def test_only_decoder_only_families_take_document_perplexity_and_in_loop_tasks():
    """Whether a family's forward gives next-token logits is its row's word -- the eval paths never
    call a model to find out (ELMo's character CNN and ELECTRA's pair need inputs a probe lacks)."""
    from glm_dist.config.checks import validate
    from glm_dist.config.loader import ConfigError, load_config
    from glm_dist.eval.perplexity import gives_next_token_logits
    from glm_dist.families.registry import FAMILIES

    decoders = {name for name in FAMILIES if gives_next_token_logits(name)}
    assert decoders == {"gpt", "gpt1"}
    for name in decoders:
        model = FAMILIES[name].model
        cfg = FAMILIES[name].config(next(iter(FAMILIES[name].flavors)), vocab_size=64)
        with torch.device("meta"):
            out = model(cfg)(torch.zeros(1, 3, dtype=torch.long, device="meta"))
        assert isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 3, 64)
    tasks = ["eval.tasks=[pydoc_cloze]", "eval.tasks_every=10"]
    validate(load_config(str(ROOT / "configs/experiments/gpt2-tiny-cpu.yaml"), tasks))
    with pytest.raises(ConfigError, match="eval.tasks scores decoder-only language models .*model.family=bert"):
        validate(load_config(str(ROOT / "configs/experiments/bert-tiny-cpu.yaml"), tasks))
