"""``glm config keys``: every config key with its type, default and help (a field's ``help`` metadata; under
``model`` and ``objective`` the keys each family and objective owns)."""

from __future__ import annotations

import argparse
import dataclasses
import typing

from glm_dist.config.schema import Config

HELP = "every config key with its type, default and help"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No arguments: the keys are those of the schema."""


def run(args: argparse.Namespace) -> int:
    hints = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        sec_cls = hints[section.name]
        sec_hints = typing.get_type_hints(sec_cls)
        for f in dataclasses.fields(sec_cls):
            if f.name == getattr(sec_cls, "__extra__", None) and hasattr(sec_cls, "extra_keys"):
                for key, typ, default, help in sec_cls.extra_keys():  # the families' and objectives' own keys
                    print(f"{section.name}.{key}: {typ} = {default!r}\n    {help}")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            typ = getattr(sec_hints[f.name], "__name__", str(sec_hints[f.name]).replace("typing.", ""))
            print(f"{section.name}.{f.name}: {typ} = {default!r}\n    {f.metadata.get('help', '')}")
    return 0
