"""Checkpoints and configs written by an earlier glm-dist still load (issue 31: the restructuring into a
package per family must keep them loading).

``tests/fixtures/compat/<family>/`` holds, per model family, a checkpoint that ``glm train`` wrote
(a one-layer model, 2 steps; ``tests/fixtures/make_compat_checkpoints.py`` made them, at the commit
each ``expected.json`` names), the run's resolved config (``config.yaml``) and ``expected.json``: a few
numbers of the model's outputs on a fixed input, computed when the fixture was written. Each test
loads the checkpoint through the public loading path (``glm eval``'s ``load_checkpoint_model``:
meta.json verified and its model config checked, the model rebuilt from it, the fp32 shards
consolidated into it), runs the fixed input and compares in fp32; and loads the config through the
config loader and validates it. A renamed parameter or module, a changed config field or a changed
checkpoint reader fails here.

To keep the fixture small (every family under 2 MiB in all) each checkpoint folder keeps the files
the weights are read from -- meta.json (unchanged, so it still lists every file the run wrote, with
its hash), the top-level JSON files, ``shards/rank*.fp32.safetensors`` (and ``.buffer``) and the
shard index ``shards/rank*.json`` -- and leaves out the optimizer moments
(``shards/rank*.exp_avg*.safetensors``) and the RNG states (``rng/``), which only a resume reads.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "compat"
FAMILY_DIRS = sorted(p for p in FIXTURES.iterdir() if (p / "expected.json").is_file()) if FIXTURES.is_dir() else []
# the files a fixture checkpoint keeps (anything else, a pickle above all, is refused)
KEPT_SUFFIXES = (".json", ".safetensors")
T = 8  # tokens of the fixed input
RTOL, ATOL = 1e-5, 1e-5  # fp32 on the CPU; a sum is compared relative to the sum of magnitudes


# -- the fixed input and each family's outputs (also used by make_compat_checkpoints.py) ---------------
def fixed_ids(vocab: int, n: int = T, offset: int = 0) -> torch.Tensor:
    """(1, n) token ids spread over the vocabulary, never 0 (often padding)."""
    return torch.tensor([[1 + (offset + 37 * i * i + 11 * i) % (vocab - 1) for i in range(n)]], dtype=torch.long)


def fixed_chars(n: int = T, width: int = 50, vocab: int = 262) -> torch.Tensor:
    """(1, n, width) character ids (ELMo's and CVT's character CNN)."""
    i = torch.arange(n * width).view(1, n, width)
    return (1 + (i * 7 + i // width * 3) % (vocab - 1)).long()


def family_outputs(family: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The family's natural outputs on the fixed input, in eval mode (dropout off)."""
    cfg = model.cfg
    model.eval()
    with torch.no_grad():
        if family in ("gpt", "gpt1"):
            return {"logits": model(fixed_ids(cfg.vocab_size))}
        if family in ("bert", "roberta", "albert"):
            ids = fixed_ids(cfg.vocab_size)
            out = model(ids, torch.zeros_like(ids), torch.ones_like(ids))
            return {k: v for k, v in out.items()}
        if family == "electra":
            ids = fixed_ids(cfg.vocab_size)
            return {
                "disc_logits": model.discriminator(ids, torch.zeros_like(ids), torch.ones_like(ids))["logits"],
                "gen_logits": model.generator(ids, torch.zeros_like(ids), torch.ones_like(ids))["logits"],
            }
        if family in ("t5", "bart"):
            return {"logits": model(fixed_ids(cfg.vocab_size), fixed_ids(cfg.vocab_size, 5, offset=3))["logits"]}
        if family == "xlnet":
            out = model(fixed_ids(cfg.vocab_size))
            return {"logits": out["logits"], "hidden_states": out["hidden_states"]}
        if family == "glove":
            words, contexts = fixed_ids(cfg.vocab_size), fixed_ids(cfg.vocab_size, offset=5)
            return {"scores": model(words, contexts), "vectors": model.vectors()[words[0]]}
        if family == "elmo":
            chars = fixed_chars(vocab=cfg.char_vocab) if cfg.char_cnn else None
            out = model(fixed_ids(cfg.vocab_size), char_ids=chars, layers=True)
            return {k: out[k] for k in ("forward_logits", "backward_logits", "layers")}
        if family == "awd-lstm":
            out = model(fixed_ids(cfg.vocab_size))
            return {"logits": out["logits"], "raw_output": out["raw_output"]}
        if family == "cvt":
            ids = fixed_ids(cfg.vocab_size)
            chars = fixed_chars(vocab=cfg.char_vocab) if cfg.char_cnn else None
            out = {f"primary_{k}": v for k, v in enumerate(model(ids, char_ids=chars, mode="teacher")["primary"])}
            for k, views in enumerate(model(ids, char_ids=chars, mode="student")["auxiliary"]):
                out.update({f"auxiliary_{k}_{view}": v for view, v in views.items()})
            return out
        if family == "cove":
            return {"logits": model(fixed_ids(cfg.vocab_size), fixed_ids(cfg.target_vocab_size, 5))["logits"]}
    raise KeyError(f"no fixed-input outputs for family {family!r}: add it to family_outputs")


def summary(t: torch.Tensor) -> dict:
    """A handful of numbers of one output: its shape, its first values, its sum and sum of magnitudes."""
    flat = t.detach().double().flatten()
    return {
        "shape": list(t.shape),
        "first": [round(v, 6) for v in flat[:6].tolist()],
        "sum": round(flat.sum().item(), 6),
        "abs_sum": round(flat.abs().sum().item(), 6),
    }


def load(checkpoint: Path) -> tuple[torch.nn.Module, dict]:
    """The public loading path: ``glm eval``'s (``glm generate``, ``features`` and ``export-hf`` read
    checkpoints through the same ``consolidated_state_dict``)."""
    from glm_dist.eval.run import load_checkpoint_model

    return load_checkpoint_model(checkpoint)


def checkpoint_of(folder: Path) -> Path:
    return folder / json.loads((folder / "expected.json").read_text())["checkpoint"]


# -- the tests --------------------------------------------------------------------------------------
def test_every_trainable_family_has_a_fixture_or_a_recorded_reason():
    from glm_dist.families.registry import FAMILIES

    covered = {p.name for p in FAMILY_DIRS}
    skipped = json.loads((FIXTURES / "skipped.json").read_text()) if (FIXTURES / "skipped.json").exists() else {}
    assert covered, f"no fixtures under {FIXTURES}: run tests/fixtures/make_compat_checkpoints.py"
    assert set(FAMILIES) <= covered | set(skipped), f"families with neither: {set(FAMILIES) - covered - set(skipped)}"
    assert not covered & set(skipped)


@pytest.mark.parametrize("folder", FAMILY_DIRS, ids=lambda p: p.name)
def test_checkpoint_loads_and_gives_the_recorded_outputs(folder: Path):
    from glm_dist.families.registry import model_config_from_dict

    expected = json.loads((folder / "expected.json").read_text())
    ckpt = checkpoint_of(folder)
    kept = [p for p in ckpt.rglob("*") if p.is_file()]
    assert kept and all(p.name.endswith(KEPT_SUFFIXES) for p in kept), kept
    model, meta = load(ckpt)
    assert meta["model_family"] == folder.name == expected["family"]
    assert meta["step"] == expected["step"]
    assert dataclasses.asdict(model.cfg) == dataclasses.asdict(
        model_config_from_dict(folder.name, meta["model_config"])
    )
    assert sum(p.numel() for p in model.parameters()) == expected["parameters"]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    outputs = family_outputs(folder.name, model)
    assert sorted(outputs) == sorted(expected["outputs"])
    for name, want in expected["outputs"].items():
        got = summary(outputs[name])
        assert got["shape"] == want["shape"], name
        torch.testing.assert_close(
            torch.tensor(got["first"]),
            torch.tensor(want["first"]),
            rtol=RTOL,
            atol=ATOL,
            msg=lambda m: f"{folder.name} {name}: {m}",
        )
        scale = max(1.0, want["abs_sum"])
        assert abs(got["sum"] - want["sum"]) <= RTOL * scale, (name, got, want)
        assert abs(got["abs_sum"] - want["abs_sum"]) <= RTOL * scale, (name, got, want)


@pytest.mark.parametrize("folder", FAMILY_DIRS, ids=lambda p: p.name)
def test_config_loads_validates_and_describes_the_checkpoints_model(folder: Path):
    from glm_dist.config.checks import model_config, validate
    from glm_dist.config.loader import load_config, to_dict
    from glm_dist.families.registry import model_config_from_dict

    cfg = load_config(folder / "config.yaml")
    validate(cfg)
    assert cfg.model.family == folder.name
    written, loaded = yaml.safe_load((folder / "config.yaml").read_text()), to_dict(cfg)
    for section, values in written.items():
        assert {k: loaded[section][k] for k in values} == values, section
    saved = json.loads((checkpoint_of(folder) / "meta.json").read_text())["model_config"]
    ours = json.loads(json.dumps(dataclasses.asdict(model_config(cfg))))
    assert {k: ours.get(k) for k in saved} == saved  # every field the checkpoint saved, as saved
    # and a field added since (GPT's post_ln) at the value the checkpoint was written with
    assert ours == json.loads(json.dumps(dataclasses.asdict(model_config_from_dict(folder.name, saved))))


def test_each_checkpoint_resumes_under_its_config():
    """A run of the fixture's config may resume its checkpoint: a model-config field added since the save
    (GPT's post_ln) reads as the value it was written with, not as a changed model."""
    from glm_dist.config.checks import model_config
    from glm_dist.config.loader import load_config
    from glm_dist.train.checkpoint import check_resumable

    for folder in FAMILY_DIRS:
        ckpt = checkpoint_of(folder)
        meta = json.loads((ckpt / "meta.json").read_text())
        check_resumable(meta, ckpt, folder.name, model_config(load_config(folder / "config.yaml")))


def test_a_renamed_parameter_fails_to_load(tmp_path):
    """What a move that renames a module does to an old checkpoint: the load refuses it by name."""
    from glm_dist.checkpoint.files import entry_of
    from glm_dist.errors import GlmError

    if not FAMILY_DIRS:
        pytest.skip("no fixtures")
    src = checkpoint_of(FAMILY_DIRS[0])
    ckpt = tmp_path / src.name
    shutil.copytree(src, ckpt)
    index = ckpt / "shards" / "rank00000.json"
    shards = json.loads(index.read_text())
    name = shards["shards"][0]["name"]
    for entry in shards["shards"]:
        if entry["name"] == name:
            entry["name"] = "renamed." + name
    data = json.dumps(shards).encode()
    index.write_bytes(data)
    meta = json.loads((ckpt / "meta.json").read_text())  # re-hashed, so the name alone is what differs
    meta["files"]["shards/rank00000.json"] = entry_of(data)
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GlmError, match="renamed"):
        load(ckpt)
