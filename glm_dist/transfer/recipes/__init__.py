"""Named fine-tuning recipes: ``<name>.yaml`` in this folder holds ``glm finetune`` option values
(``--recipe NAME`` or a path to such a file); options given on the command line win over them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from glm_common.config_yaml import read_yaml_file
from glm_dist.transfer.options import FinetuneArgs, FinetuneError

HERE = Path(__file__).parent
MAX_BYTES = 64 * 1024  # a recipe is a few lines


def available() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_recipe(name_or_path: str) -> dict:
    """The option values of a named recipe (``gpt``) or a YAML file; unknown keys are refused."""
    path = Path(name_or_path) if name_or_path.endswith((".yaml", ".yml")) else HERE / f"{name_or_path}.yaml"
    if not path.is_file():
        raise FinetuneError(
            f"no fine-tuning recipe {name_or_path!r}; named ones: {', '.join(available())}, or give a .yaml path"
        )
    values = read_yaml_file(path, max_bytes=MAX_BYTES) or {}
    if not isinstance(values, dict):
        raise FinetuneError(f"{path}: a recipe is a mapping of option: value")
    known = {f.name: str(f.type) for f in dataclasses.fields(FinetuneArgs) if f.name not in ("checkpoint", "train")}
    for key, value in values.items():
        if key not in known:
            raise FinetuneError(f"{path}: unknown recipe key {key!r}; known: {', '.join(sorted(known))}")
        values[key] = _typed(path, key, value, known[key])
    return values


def _typed(path: Path, key: str, value, kind: str):
    """``value`` as the option's type (YAML reads ``1e-3`` as a string)."""
    if "bool" in kind:
        if not isinstance(value, bool):
            raise FinetuneError(f"{path}: {key} must be true or false, got {value!r}")
        return value
    cast = float if "float" in kind else int if "int" in kind else str
    try:
        if isinstance(value, (bool, list, dict)):
            raise ValueError(value)
        return cast(value)
    except ValueError:
        raise FinetuneError(f"{path}: {key} must be {cast.__name__}, got {value!r}") from None


def finetune_args(given: dict) -> FinetuneArgs:
    """``glm finetune``'s options: the recipe's values (``given["recipe"]``), then the ones given."""
    given = {k: v for k, v in given.items() if v is not None}
    recipe = load_recipe(given.pop("recipe")) if "recipe" in given else {}
    return FinetuneArgs(**{**recipe, **given})
