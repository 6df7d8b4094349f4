"""The native sources: each header compiles on its own (it includes what it uses, and its guard
lets a file include it twice) at every kernel level, and the library's cache key covers every file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from levels_support import skip_unless_here

from draftgate.models.native import LEVELS, build

NATIVE = Path(build.__file__).resolve().parent
HEADERS = sorted(p.name for p in NATIVE.glob("*.h"))


def test_the_cache_key_covers_every_source_file() -> None:
    """build._SOURCES (what the cache key hashes) lists every .h and .cpp beside it: an edit to any
    of them rebuilds the library."""
    assert sorted(build._SOURCES) == sorted(p.name for p in NATIVE.iterdir() if p.suffix in (".h", ".cpp"))
    assert "kernels.cpp" in build._SOURCES and len(HEADERS) > 5


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("header", HEADERS)
def test_each_header_compiles_on_its_own(header: str, level: str) -> None:
    """A file that includes only this header, twice, compiles with build.py's flags for the level."""
    skip_unless_here(level)
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("no g++ here: the headers are not compiled one by one")
    flags = [f for f in build._FLAGS if f not in ("-shared", "-fPIC")] + build._MARCH[level]
    cmd = [cxx, *flags, "-fsyntax-only", "-Werror", "-Wno-unused-function", "-I", str(NATIVE), "-x", "c++", "-"]
    unit = f'#include "{header}"\n#include "{header}"\n'
    res = subprocess.run(cmd, input=unit, capture_output=True, text=True, check=False)
    assert res.returncode == 0, f"{header} alone at {level}:\n{res.stderr[-3000:]}"
