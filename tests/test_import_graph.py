"""The project's import graph has no circles and every arrow points down the floors.

The graph is read with `ast` from the source, not by importing it: every `import` and `from ... import`
of the project's own modules counts, at module level and inside functions alike (a function-local
import hides an arrow, it does not remove it). `from pkg import name` points at `pkg.name` when that
is a module, otherwise at `pkg`; relative imports are resolved against the importing file. Imports
under `if TYPE_CHECKING:` never run and are left out. The floors are those of docs/architecture.md
("Floors"); an arrow may point to its own floor or any floor below, never above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("glm_common", "data_pipeline", "glm_dist")

# Floor of each module, by the longest matching prefix (docs/architecture.md, "Floors").
FLOORS: dict[str, int] = {
    "glm_common": 0,
    "data_pipeline": 1,  # never imports glm_dist
    "glm_dist": 2,  # the package itself; its top-level modules are placed below
    "glm_dist.errors": 2,
    "glm_dist.ops": 2,
    "glm_dist.models": 3,  # layers the families share
    "glm_dist.families": 3,  # a package per family: its model and transformers adapter; the registry
    "glm_dist.objectives": 4,
    "glm_dist.config": 5,  # the config names families and objectives; its checks read their tables
    "glm_dist.checkpoint": 6,  # the format; knows configs and families, not process groups
    "glm_dist.observability": 6,
    "glm_dist.parallel": 7,
    "glm_dist.families.*.pipeline": 7,  # a family's pipeline cut, built on parallel/pipeline.py (its row names it)
    "glm_dist.data": 8,  # ranks share reads through parallel's collectives
    "glm_dist.eval": 9,
    "glm_dist.train": 10,  # the loop evaluates in the loop
    "glm_dist.hf": 11,
    "glm_dist.transfer": 11,
    "glm_dist.launch": 12,
    "glm_dist.slurm": 12,
    "glm_dist.cli": 12,
    "glm_dist.commands": 12,  # the command table and a module per command of cli.py
    "glm_dist.cli_doc": 12,
}

# Known violations still to remove: (importer, imported) -> why it is still there. Empty when the rule holds.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
ALLOWED_CYCLES: dict[frozenset[str], str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _import_nodes(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that `name` (at `path`) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            targets.add(sub if sub in modules else base)
    return {target for target in targets if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def _matches(prefix: str, key: str) -> bool:
    """``key`` names ``prefix``; a ``*`` in ``key`` stands for any one name (any family)."""
    names, pattern = prefix.split("."), key.split(".")
    return len(names) == len(pattern) and all(p in ("*", n) for n, p in zip(names, pattern))


def floor_of(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        found = [floor for key, floor in FLOORS.items() if _matches(prefix, key)]
        if found:
            return max(found)
    raise KeyError(f"{module} has no floor: add its folder to FLOORS and to docs/architecture.md")


def cycles(graph: dict[str, set[str]]) -> dict[frozenset[str], list[str]]:
    """Each strongly connected component of more than one module (Tarjan) -> a cycle path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return {frozenset(component): _cycle_path(graph, component) for component in components}


def _cycle_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself (breadth first)."""
    start = min(component)
    previous: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def upward_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((src, dst) for src, targets in graph.items() for dst in targets if floor_of(dst) > floor_of(src))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_module_has_a_floor(graph):
    for module in graph:
        floor_of(module)


def test_no_import_circles(graph):
    found = [(path, len(members)) for members, path in cycles(graph).items() if members not in ALLOWED_CYCLES]
    assert not found, "import circles (break each by moving the shared definition down):\n" + "\n".join(
        " -> ".join(path) + f" ({size} modules in the circle)" for path, size in found
    )


def test_imports_point_down_the_floors(graph):
    found = [arrow for arrow in upward_arrows(graph) if arrow not in ALLOWED_UPWARD]
    assert not found, "imports that run up the floors (docs/architecture.md, Floors):\n" + "\n".join(
        f"{src} (floor {floor_of(src)}) -> {dst} (floor {floor_of(dst)})" for src, dst in found
    )


def test_the_allow_lists_hold_only_live_violations(graph):
    live_cycles = set(cycles(graph))
    assert not set(ALLOWED_CYCLES) - live_cycles, "a listed circle is gone: remove it from ALLOWED_CYCLES"
    assert not set(ALLOWED_UPWARD) - set(upward_arrows(graph)), "a listed arrow is gone: remove it from ALLOWED_UPWARD"


def test_the_graph_sees_local_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n    from .c import thing\n")
    (pkg / "b.py").write_text("")
    (pkg / "c.py").write_text("thing = 1\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py", "pkg.c": pkg / "c.py"}
    assert imports_of("pkg.a", pkg / "a.py", modules) == {"pkg.b", "pkg.c"}


def test_a_familys_pipeline_cut_stands_on_parallels_floor():
    assert floor_of("glm_dist.families.gpt.pipeline") == FLOORS["glm_dist.parallel"]
    assert floor_of("glm_dist.families.gpt.model") == floor_of("glm_dist.families.spec") == FLOORS["glm_dist.families"]


def test_a_circle_is_reported_as_its_path():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == {frozenset("abc"): ["a", "b", "c", "a"]}
