"""The plugin boundary holds (issue 14): no stage imports the API client (lightkube) or the
cluster services (nodeagent/cluster), no stage imports another stage's modules, and no two
modules of the project import each other in a cycle. Read from the source's imports (AST), so
a new violation fails here whatever it does at run time."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("nodeagent", "plugins", "cri", "drivers")
STAGES = ROOT / "plugins"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_generated" not in path.parts:
                yield path


def _imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, at import time) for every import of ``path`` — ``at import
    time``: not inside a function or under ``if TYPE_CHECKING`` (those cannot make a cycle)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module(path) if path.name == "__init__.py" else _module(path).rpartition(".")[0]

    def visit(node: ast.AST, eager: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            lazy = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, child.lineno, eager
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                yield base, child.lineno, eager
                for alias in child.names:  # `from plugins.volumes import sources` imports a module
                    yield f"{base}.{alias.name}", child.lineno, eager
            yield from visit(child, eager and not lazy)

    yield from visit(tree, True)


def _stage_of(module: str) -> str | None:
    """The stage a ``plugins.<name>...`` module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "plugins" else None


def test_stages_reach_the_api_only_through_the_object_store() -> None:
    offences = []
    for path in sorted(STAGES.rglob("*.py")):
        for imported, line, _ in _imports(path):
            if imported.split(".")[0] == "lightkube" or imported.startswith("nodeagent.cluster"):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not offences, "\n".join(offences)


def test_no_stage_imports_another_stages_modules() -> None:
    known = {p.stem if p.is_file() else p.name for p in STAGES.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    offences = []
    for path in sorted(STAGES.rglob("*.py")):
        own = _stage_of(_module(path))
        for imported, line, _ in _imports(path):
            other = _stage_of(imported)
            if other is not None and other in known and other != own:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not offences, "\n".join(offences)


def test_there_is_no_import_cycle() -> None:
    modules = {_module(p): p for p in _sources()}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported, _, eager in _imports(path):
            if not eager:
                continue
            # Importing a.b.c runs the __init__ of a and a.b first.
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):
                target = ".".join(parts[:end])
                if target in modules and target != name:
                    targets.add(target)
        graph[name] = targets
    # A module's own packages are already being imported when it runs: no edge back to them.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}

    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                walk(target)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)
