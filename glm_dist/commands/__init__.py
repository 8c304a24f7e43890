"""The ``glm`` commands: one module each, listed in ``COMMANDS`` and dispatched by name (``glm_dist/cli.py``).

A command module has ``HELP`` (the line ``glm --help`` lists it with), ``add_arguments(parser)`` and
``run(args) -> int`` (the exit code). The two in ``OWN_OPTIONS`` read their own options instead: torchrun's
and sbatch's follow them unparsed, so their modules have ``HELP`` and ``main(argv) -> int``.

The table names modules rather than importing them: a run imports the one module it runs (as pip's
``commands_dict`` does), so ``glm config show`` does not load the evaluation, fine-tuning and crawl stacks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> module, in the order of ``glm --help`` and docs/cli.md (a run's life: train, use the checkpoint, inspect;
# then the data: crawl, tokenize, mix, the task sets); a name of two words is a subcommand of a group
COMMANDS: dict[str, str] = {
    "train": "glm_dist.commands.train",
    "eval": "glm_dist.commands.eval",
    "generate": "glm_dist.commands.generate",
    "features": "glm_dist.commands.features",
    "finetune": "glm_dist.commands.finetune",
    "export-hf": "glm_dist.commands.export_hf",
    "checkpoint convert": "glm_dist.commands.checkpoint_convert",
    "config show": "glm_dist.commands.config_show",
    "config keys": "glm_dist.commands.config_keys",
    "plan": "glm_dist.commands.plan",
    "data run": "glm_dist.commands.data_run",
    "data train-classifier": "glm_dist.commands.data_train_classifier",
    "data tokenize": "glm_dist.commands.data_tokenize",
    "data index": "glm_dist.commands.data_index",
    "data mix": "glm_dist.commands.data_mix",
    "data cooccur": "glm_dist.commands.data_cooccur",
    "data vectors": "glm_dist.commands.data_vectors",
    "data eval-tasks": "glm_dist.commands.data_eval_tasks",
    "data tagging": "glm_dist.commands.data_tagging",
    "data token-tasks": "glm_dist.commands.data_token_tasks",
    "data docstring-task": "glm_dist.commands.data_docstring_task",
    "data gettext": "glm_dist.commands.data_gettext",
}
# name -> module of the commands that parse their own options (``main(argv)``)
OWN_OPTIONS: dict[str, str] = {
    "launch": "glm_dist.commands.launch",
    "slurm": "glm_dist.commands.slurm",
}
# the first word of a two-word command -> the line ``glm --help`` lists the group with
GROUPS: dict[str, str] = {
    "checkpoint": "checkpoint maintenance",
    "config": "inspect configs",
    "data": "data preparation",
}

run_dir: str | None = None  # the running command's folder, where a crash report goes (glm train sets it)


def load(name: str) -> ModuleType:
    """The module of the command ``name`` (``"data tokenize"``), imported now."""
    return importlib.import_module(COMMANDS.get(name) or OWN_OPTIONS[name])


def named(argv: list[str]) -> str | None:
    """The command ``argv`` starts with, or None (``glm --help``, a group without its subcommand, a typo)."""
    for words in (2, 1):
        name = " ".join(argv[:words])
        if len(argv) >= words and name in COMMANDS:
            return name
    return None
