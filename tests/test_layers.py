"""The shape of the tree, enforced: lower layers never import upper ones, the serving layer uses
only the engine's public surface and none of the math, and the package's public API is curated.

Imports are read from the source (every ``import`` and ``from ... import``, also inside
functions), so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import draftgate
from import_graph import find_cycle, import_graph, module_files

SRC = Path(draftgate.__file__).resolve().parent

# Rank of each top-level part: a module may import parts of its own rank or lower.
RANK = {
    "types": 0,
    "errors": 0,
    "paths": 0,
    "data": 0,
    "sampling": 1,
    "kv": 1,
    "verify": 2,
    "models": 3,
    "drafters": 4,
    "modelinfo": 4,
    "engine": 5,
    "server": 6,
    "bench": 6,
    "train": 6,
    "integrations": 6,
    "cli": 7,
    "__main__": 7,  # `python -m draftgate`: the command line
}
# Same rank, still not allowed (the tools know nothing of each other; drafters know no model tools).
FORBIDDEN = {
    ("bench", "train"),
    ("train", "bench"),
    ("bench", "server"),
    ("train", "server"),
    ("server", "bench"),
    ("server", "train"),
    ("drafters", "modelinfo"),
    ("modelinfo", "drafters"),
    ("kv", "sampling"),
    ("sampling", "kv"),
}
# What the serving layer may use of the engine: its public surface, never its internals.
ENGINE_INTERNALS = {
    "draftgate.engine.controller",
    "draftgate.engine.costs",
    "draftgate.engine.step",
    "draftgate.engine.sequence",
}
MATH = ("draftgate.sampling", "draftgate.verify")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if "_pb2" not in name:
            out.append((name, path))
    return out


def _imports(path: Path, module: str) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every draftgate import in the file."""
    tree = ast.parse(path.read_text())
    pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("draftgate")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("draftgate"):
                found.append((base, [a.name for a in node.names]))
    return found


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


MODULES = _modules()


def test_every_part_has_a_rank() -> None:
    parts = {_part(m) for m, _ in MODULES} - {""}
    assert parts <= set(RANK), f"parts without a rank: {parts - set(RANK)}"


def layer_violations(module: str, path: Path) -> list[str]:
    me = _part(module)
    if not me:
        return []  # draftgate/__init__.py re-exports the public API
    out = []
    for imported, _ in _imports(path, module):
        other = _part(imported)
        if not other or other == me:
            continue
        if RANK[other] > RANK[me]:
            out.append(f"{module} ({me}, rank {RANK[me]}) imports {imported} (rank {RANK[other]})")
        if (me, other) in FORBIDDEN:
            out.append(f"{module} imports {imported}: {me} must know nothing of {other}")
    return out


@pytest.mark.parametrize(("module", "path"), MODULES, ids=[m for m, _ in MODULES])
def test_no_layer_imports_an_upper_one(module: str, path: Path) -> None:
    assert layer_violations(module, path) == []


def test_the_check_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    """Negative control: an import inside a function, upwards, is caught."""
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from draftgate.server.app import create_app\n    from ..engine import Engine\n")
    found = layer_violations("draftgate.models.fake", fake)
    assert len(found) == 2 and "draftgate.server.app" in found[0] and "draftgate.engine" in found[1]


@pytest.mark.parametrize(
    ("module", "path"),
    [(m, p) for m, p in MODULES if _part(m) == "server"],
    ids=[m for m, _ in MODULES if _part(m) == "server"],
)
def test_the_server_uses_only_the_engines_public_surface_and_no_math(module: str, path: Path) -> None:
    for imported, names in _imports(path, module):
        assert imported not in ENGINE_INTERNALS, f"{module} imports engine internals: {imported}"
        assert not imported.startswith(MATH), f"{module} imports the math: {imported}"
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{module} imports private names {private} from {imported}"


def test_the_public_api_is_curated() -> None:
    assert sorted(draftgate.__all__) == sorted(
        [
            "__version__",
            "DrafterKind",
            "Engine",
            "EngineConfig",
            "SamplingParams",
            "SpecStats",
            "build_engine",
            "Kernels",
            "load_model",
            "DraftGateError",
            "BadRequestError",
            "CapacityError",
            "ModelLoadError",
        ]
    )
    for name in draftgate.__all__:
        assert hasattr(draftgate, name), name


def test_the_package_imports_form_a_dag() -> None:
    """No import cycle anywhere in draftgate (function-level imports count: a lazy import hides none)."""
    modules = {m: p for m, p in module_files(SRC, "draftgate").items() if "_pb2" not in m}
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
