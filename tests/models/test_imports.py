"""The modules of draftgate.models import one another in one direction only, and none reaches into
another's private names.

Every ``from draftgate.models... import`` and ``import draftgate.models...`` of every module counts,
at module level or inside a function or an ``if TYPE_CHECKING:`` block alike: a cycle hidden in a
function-level import is still a cycle.
"""

from __future__ import annotations

from pathlib import Path

import draftgate.models
from import_graph import find_cycle, import_graph, imports_of, module_files, private_imports

PACKAGE = "draftgate.models"


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
