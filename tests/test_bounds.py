"""The tree's bounds, enforced so they cannot drift: module and page sizes, the formatter, no files cited
from outside the repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "draftgate"
MAX_MODULE_LINES = 400
MAX_BENCHMARKS_LINES = 400
MAX_FMT_SKIPS = 10  # only on tables the formatter would spread over a screen


def _python_files() -> list[Path]:
    return [p for p in (ROOT / "src").rglob("*.py") if "_pb2" not in p.name]


def test_every_module_fits_its_budget() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_benchmarks_page_fits_its_budget() -> None:
    n = len((ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines())
    assert n <= MAX_BENCHMARKS_LINES, (
        f"docs/BENCHMARKS.md has {n} lines: replace re-measured tables, fold studies into rows"
    )


def test_formatter_escapes_are_rare() -> None:
    files = [*_python_files(), *(ROOT / "tests").rglob("*.py")]
    skips = sum(p.read_text().count("# fmt: skip") for p in files if p.name != Path(__file__).name)
    assert skips <= MAX_FMT_SKIPS, f"{skips} `# fmt: skip` comments (at most {MAX_FMT_SKIPS}, on tables only)"


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(), reason="ruff not installed"
)
def test_the_tree_is_formatter_clean() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    cmd = [str(ruff) if ruff.exists() else "ruff", "format", "--check", "src", "tests", "benchmarks"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"run `ruff format src tests benchmarks`:\n{res.stdout[-2000:]}"


def test_nothing_cites_a_document_outside_the_repository() -> None:
    pattern = re.compile(r"DESIGN( §?[0-9]|\.md)|\.\./shared")
    files = [*_python_files(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    bad = [str(p.relative_to(ROOT)) for p in files if p.name != Path(__file__).name and pattern.search(p.read_text())]
    assert not bad, f"these files cite a document that is not in the repository: {bad}"
