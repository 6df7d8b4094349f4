"""The modules of draftgate.models import one another in one direction only, and none reaches into
another's private names.

Every ``from draftgate.models... import`` and ``import draftgate.models...`` of every module counts,
at module level or inside a function or an ``if TYPE_CHECKING:`` block alike: a cycle hidden in a
function-level import is still a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import draftgate.models

PACKAGE = "draftgate.models"


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


def _models() -> dict[str, Path]:
    return module_files(Path(draftgate.models.__file__).resolve().parent, PACKAGE)


def test_models_imports_form_a_dag() -> None:
    modules = _models()
    assert {"draftgate.models.eagle", "draftgate.models.native.build"} <= set(modules)
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_imports_another_modules_private_names() -> None:
    bad = private_imports(_models())
    assert not bad, bad


def test_the_check_sees_a_cycle_behind_a_function_level_import(tmp_path: Path) -> None:
    """Negative control: a imports b at module level, b imports a inside a function (or for typing only)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub.c import C\n")
    (pkg / "sub" / "c.py").write_text("C = 1\n")
    (pkg / "a.py").write_text("from pkg.b import f\nfrom pkg.sub import c\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a\n    from . import _hidden\n")
    modules = module_files(pkg, "pkg")
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.b", "pkg.sub", "pkg.sub.c"} and graph["pkg.sub.c"] == set()
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert imports_of("pkg.b", pkg / "b.py", modules) == [("pkg.a", "", 2), ("pkg", "_hidden", 3)]
    assert private_imports(modules) == ["b.py:3 imports pkg._hidden"]
    (pkg / "b.py").write_text("def f():\n    return 1\n")
    assert find_cycle(import_graph(modules)) is None
