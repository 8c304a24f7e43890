"""lm-eval task YAMLs for the tasks built offline (``data_pipeline/tasks``), one per task, and
variants of them (a YAML that ``include:`` s a task's YAML and changes its decoding or metrics).

``build_tasks(out_dir)`` (``glm data eval-tasks --out DIR``) runs each task's builder and writes
``DIR/<task>/``: the splits as JSONL, the data card, the trivial baselines and the task's YAML with
``dataset_kwargs.data_files`` pointing at those files, its variants' YAMLs beside it, and
``scoring.py`` where a YAML names one of its functions (``!function scoring.<name>``), so
``--include-path DIR`` makes them lm-eval tasks (``glm eval --tasks pydoc_cloze --include-path DIR``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from data_pipeline.tasks import builders
from data_pipeline.tasks.built import write_task
from glm_dist.errors import GlmError

HERE = Path(__file__).parent


class Function(str):
    """A ``!function module.name`` value of a task YAML, kept as written."""


class _Loader(yaml.SafeLoader):
    pass


class _Dumper(yaml.SafeDumper):
    pass


_Loader.add_constructor("!function", lambda loader, node: Function(loader.construct_scalar(node)))
_Dumper.add_representer(Function, lambda dumper, value: dumper.represent_scalar("!function", str(value)))


def task_config(name: str) -> dict:
    return yaml.load((HERE / f"{name}.yaml").read_text(), Loader=_Loader)


def task_names() -> list[str]:
    """Every task and variant (the YAMLs' names)."""
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def base_task(name: str) -> str:
    """The built task a variant includes (itself for a task)."""
    config = task_config(name)
    return base_task(Path(config["include"]).stem) if "include" in config else name


def build_tasks(out_dir: str | Path, names: list[str] | None = None, **options) -> dict[str, Path]:
    """Build ``names`` (default: all; a variant builds its task) into ``out_dir``; ``options`` go to
    the builders that take them (``documents`` for the pydoc tasks, ``wordnet_dir`` for WordNet).
    Returns task or variant -> its folder."""
    from inspect import signature

    available = builders()
    unknown = sorted(set(names or []) - set(task_names()))
    if unknown:
        raise GlmError(f"unknown task {unknown[0]!r}; known: {', '.join(task_names())}")
    wanted = names or task_names()
    if options.get("documents") is not None:
        options["documents"] = list(options["documents"])  # several builders read the corpus
    bases = sorted({base_task(n) for n in wanted})
    folders = {}
    for name in bases:
        build = available[name]
        task = build(**{k: v for k, v in options.items() if k in signature(build).parameters and v is not None})
        folder = Path(out_dir) / name
        paths = write_task(task, str(folder))
        config = task_config(name)
        config["dataset_kwargs"]["data_files"] = paths
        _write_yaml(folder, name, config)
        folders[name] = folder
        for variant in [n for n in task_names() if n != name and base_task(n) == name]:
            _write_yaml(folder, variant, task_config(variant))
            folders[variant] = folder
    return {n: folders[n] for n in sorted(set(wanted) | set(bases))}


def _write_yaml(folder: Path, name: str, config: dict) -> None:
    (folder / f"{name}.yaml").write_text(yaml.dump(config, Dumper=_Dumper, sort_keys=False, allow_unicode=True))
    modules = {v.split(".")[0] for v in config.values() if isinstance(v, Function)}
    for module in modules:
        shutil.copyfile(HERE / f"{module}.py", folder / f"{module}.py")
