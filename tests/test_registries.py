"""One row per family and per objective (docs/architecture.md, decision 10): no other module of the
library tests a family's or an objective's name, and every row is complete."""
from __future__ import annotations

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


def _allowed(path: Path) -> bool:
    rel = path.relative_to(LIB).as_posix()
    objective_files = {f"objectives/{name}.py" for name in OBJECTIVES}
    family_package = rel.startswith("families/") and rel.count("/") == 2  # families/<family>/<module>.py
    return family_package or rel in objective_files | {"families/registry.py", "objectives/registry.py",
                                                       "config/schema.py"}


def quoted_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string literal that is exactly a family or objective name."""
    names = set(FAMILIES) | set(OBJECTIVES)
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            body = tok.string.lstrip("rbuRBU")
            if body[:1] in "'\"" and body.strip("'\"") in names and len(body) == len(body.strip("'\"")) + 2:
                found.append((tok.start[0], body.strip("'\"")))
    return found


def test_no_module_outside_the_registries_tests_a_family_or_objective_name():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in sorted(LIB.rglob("*.py"))
                 if not _allowed(path) for line, name in quoted_names(path.read_text())]
    assert not offenders, "family / objective names outside their files and registries:\n" + "\n".join(offenders)


def test_the_scan_catches_what_it_is_for():
    assert quoted_names('if meta["model_family"] == "electra":\n    x = {"t5": 1, \'clm\': 2}\n') == [
        (1, "electra"), (2, "t5"), (2, "clm")]
    assert quoted_names('"""the gpt family"""\nname = "gpt2-small"\n') == []


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
