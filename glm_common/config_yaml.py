"""YAML config files with ``base:`` inheritance, ``key=value`` overrides and a strict dataclass schema:
the rules of training configs (``glm_dist.config``) and data-pipeline recipes (``data_pipeline.recipe``).

Each leaf value remembers where it was set (a file or the command line), so every error can say
which key is wrong and which file to edit.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from glm_common.errors import GlmError

CLI = "<command line>"
MAX_CONFIG_BYTES = 2**20  # a config and all its bases together; ours are under 4 KiB each
MAX_CONFIG_FILES = 64  # files merged for one config (a base listed twice counts twice)
MAX_DEPTH = 32  # nested sections and lists; ours go 3 deep


class ConfigError(GlmError, ValueError):
    """A config that cannot be used; the message names the key, its source and the fix."""


class _Refused(Exception):
    """YAML that is refused before it is built: what, and the line."""


class _StrictLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without the two ways a few bytes of YAML cost gigabytes or the stack: aliases
    (a "billion laughs" nests references to references; every consumer that walks the tree expands
    them) and deep nesting (the composer and constructor recurse once per level). Both are refused
    while composing, before the level below is read."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(
                f"line {event.start_mark.line + 1}: YAML anchors and aliases (&name, *name, <<: *name) "
                f"are not accepted in configs; write the values out, or share them through base:"
            )
        if self._depth == MAX_DEPTH:
            raise _Refused(
                f"line {event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep; "
                f"a config is sections of keys and short lists"
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class TaggedLoader(_StrictLoader):
    """The strict loader that also reads tags (``!function x``) as ``None``: for lm-eval task YAMLs."""


TaggedLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _parse_yaml(text: str, loader_cls: type = _StrictLoader) -> Any:
    """The YAML document in ``text`` (``_Refused`` for aliases or deep nesting, ``yaml.YAMLError``)."""
    loader = loader_cls(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _parse_file_bytes(raw: bytes, path: Path, loader_cls: type = _StrictLoader) -> Any:
    """The YAML document in the bytes read from ``path``; ``ConfigError`` with one line otherwise."""
    try:
        return _parse_yaml(raw.decode("utf-8"), loader_cls)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path} is not UTF-8 text (byte {err.start}): not a YAML file") from None
    except _Refused as err:
        raise ConfigError(f"{path}, {err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {_one_line(err)}") from None


def read_yaml_file(path: str | Path, *, max_bytes: int = MAX_CONFIG_BYTES, tags: bool = False) -> Any:
    """One YAML file that is not a config (a fine-tuning recipe, a task file) under the same rules:
    at most ``max_bytes``, a regular file, UTF-8, no aliases, bounded nesting; ``ConfigError`` with
    one line otherwise. ``tags=True`` reads ``!tag value`` nodes as ``None``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} is not a regular file")
    with path.open("rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ConfigError(f"{path} is larger than {max_bytes} bytes: not a YAML file of this kind")
    return _parse_file_bytes(raw, path, TaggedLoader if tags else _StrictLoader)


def load_structured(cls: type, path: str | Path | None, overrides: list[str] = (), lists: tuple[str, ...] = ()) -> Any:
    """The same YAML rules for any dataclass schema (training configs, data-pipeline recipes).
    ``lists``: top-level keys whose value may be given as one string or comma-separated strings."""
    tree: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        _merge_file(Path(path), tree, sources, chain=(), read={"files": 0, "bytes": 0})
    for item in overrides:
        key, value = _parse_override(item)
        _set_dotted(tree, sources, key, value, CLI)
    for key in lists:
        if isinstance(tree.get(key), str):
            tree[key] = [part for part in tree[key].split(",") if part]
    cfg = _build(cls, tree, sources, prefix="")
    cfg.__dict__["_sources"] = sources
    return cfg


def source_of(cfg: Any, key: str) -> str:
    """Where ``key`` (dotted) was set: a file path, the command line, or the schema default."""
    return cfg.__dict__.get("_sources", {}).get(key, "<default>")


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as nested dicts, as a YAML file would give it: a section's ``__extra__`` keys sit
    beside its own (``model.mem_len``, not ``model.options.mem_len``)."""
    return _lift_extra(type(cfg), dataclasses.asdict(cfg))


def _lift_extra(cls: type, tree: dict) -> dict:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]) and isinstance(tree.get(f.name), dict):
            _lift_extra(hints[f.name], tree[f.name])
    extra_field = getattr(cls, "__extra__", None)
    if extra_field is not None:
        tree.update(tree.pop(extra_field) or {})
    return tree


def _merge_file(path: Path, tree: dict, sources: dict, chain: tuple[Path, ...], read: dict[str, int]) -> None:
    """Merge ``path`` and its bases into ``tree``; ``read`` counts the files and bytes of the whole chain."""
    path = path.resolve() if path.exists() else path
    if not path.exists():
        where = f" (base of {chain[-1]})" if chain else ""
        raise ConfigError(f"config file {path}{where} does not exist")
    if path in chain:
        raise ConfigError(f"config inheritance loops: {' -> '.join(map(str, chain + (path,)))}")
    if not path.is_file():
        raise ConfigError(
            f"config {path} is not a file (a directory?); pass a YAML file, e.g. configs/experiments/gpt2-tiny-cpu.yaml"
        )
    read["files"] += 1
    if read["files"] > MAX_CONFIG_FILES:
        raise ConfigError(
            f"config {chain[0]} merges more than {MAX_CONFIG_FILES} files through base: (at {path}); "
            f"list each base once"
        )
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES - read["bytes"] + 1)
    read["bytes"] += len(raw)
    if read["bytes"] > MAX_CONFIG_BYTES:
        whole = f"config {path}" if not chain else f"config {chain[0]} with its bases (at {path})"
        raise ConfigError(f"{whole} is larger than {MAX_CONFIG_BYTES // 2**20} MiB: not a config file")
    data = _parse_file_bytes(raw, path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level, got {type(data).__name__}")
    bases = data.pop("base", None)
    for base in [bases] if isinstance(bases, str) else (bases or []):
        _merge_file(path.parent / base, tree, sources, chain + (path,), read)
    for key, value in _flatten(data):
        _set_dotted(tree, sources, key, value, str(path))


def _one_line(err: yaml.YAMLError) -> str:
    """PyYAML's reason and position on one line (its own message quotes the text over several)."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(err).split())
    context = f" ({err.context})" if getattr(err, "context", None) else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}{context}"


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, Any]]:
    items = []
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            items.extend(_flatten(value, dotted + "."))
        else:
            items.append((dotted, value))
    return items


def _parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. train.lr=3e-4)")
    key, raw = item.split("=", 1)
    try:
        value = _parse_yaml(raw) if raw != "" else None
    except _Refused as err:
        raise ConfigError(f"override {key.strip()}=...: {err}") from None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _set_dotted(tree: dict, sources: dict, key: str, value: Any, source: str) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: {'.'.join(parts[:-1])} is a value, not a section ({source})")
        node = child
    node[parts[-1]] = value
    sources[key] = source


def _build(cls: type, data: dict, sources: dict, prefix: str) -> Any:
    """``cls`` from ``data``, strictly. A section whose class names an ``__extra__`` field takes keys
    its own fields do not name: ``cls.extra_schema(values, extra)`` answers, from the section's own
    values, the dataclass those keys must fit (a model family's options) and the keys to build it from."""
    hints = typing.get_type_hints(cls)
    extra_field = getattr(cls, "__extra__", None)
    fields = {f.name for f in dataclasses.fields(cls)} - {extra_field}
    rest = {key: value for key, value in data.items() if key not in fields}
    if rest and extra_field is None:
        _refuse_unknown(next(iter(rest)), prefix, sources, fields)
    kwargs = {}
    for name, value in data.items():
        if name not in fields:
            continue
        dotted = prefix + name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"'{dotted}' in {sources.get(dotted, '?')} must be a section")
            kwargs[name] = _build(hint, value, sources, dotted + ".")
        else:
            kwargs[name] = _check_type(dotted, value, hint, sources.get(dotted, "?"))
    if extra_field is not None:
        schema, rest = cls.extra_schema(kwargs, rest)
        if schema is not None:
            known = {f.name for f in dataclasses.fields(schema)}
            for key in rest:
                if key not in known:
                    _refuse_unknown(key, prefix, sources, fields | known)
            rest = _build(schema, rest, sources, prefix)
        kwargs[extra_field] = rest
    return cls(**kwargs)


def _refuse_unknown(key: str, prefix: str, sources: dict, known: set[str]) -> None:
    dotted = prefix + key
    raise ConfigError(
        f"unknown key '{dotted}' in {_source_under(sources, dotted)}; known keys of "
        f"'{prefix[:-1] or 'config'}': {', '.join(sorted(known))}"
    )


def _source_under(sources: dict, dotted: str) -> str:
    for key, src in sources.items():
        if key == dotted or key.startswith(dotted + "."):
            return src
    return "?"


def _check_type(key: str, value: Any, hint: Any, source: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[X], X | None
        if value is None:
            return None
        return _check_type(key, value, next(a for a in args if a is not type(None)), source)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"'{key}' = {value!r} in {source}: must be one of {list(args)}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if hint is list and isinstance(value, list):
        return value
    expected = origin or hint
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(
            f"'{key}' = {value!r} in {source}: expected {getattr(expected, '__name__', expected)}, "
            f"got {type(value).__name__}"
        )
    return value
