"""The import graph of a package read from its source (every import, also inside functions and
``if TYPE_CHECKING:`` blocks): cycles and imports of another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module under the package folder ``root``, by dotted name (a package by its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) of each import of a module of ``modules`` in ``path``."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package upwards
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, "", node.lineno) if sub in modules else (base, a.name, node.lineno))
    return [(m, n, line) for m, n, line in found if m in modules]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules its imports run: the imported one and its packages (not the importer's own)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for target, _, _ in imports_of(name, path, modules):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                dep = ".".join(parts[:i])
                if dep in modules and dep != name and not name.startswith(dep + "."):
                    graph[name].add(dep)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None for a DAG."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)) is not None:
            return cycle
    return None


def private_imports(modules: dict[str, Path]) -> list[str]:
    """Each import of another module's private (underscore) name, as "file:line imports module.name"."""
    return [
        f"{path.name}:{line} imports {target}.{imported}"
        for name, path in modules.items()
        for target, imported, line in imports_of(name, path, modules)
        if imported.startswith("_") and not imported.startswith("__") and target != name
    ]
