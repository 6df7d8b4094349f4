"""Kernel levels in tests: parametrize over every level and skip, reported, the ones this CPU lacks."""

from __future__ import annotations

import pytest

from draftgate.models.native import levels_here


def skip_unless_here(level: str) -> None:
    """Skip the test (its reason in the report) where this CPU cannot run kernel level ``level``."""
    if level not in levels_here():
        pytest.skip(f"this CPU lacks the instructions of kernel level {level} (it runs {', '.join(levels_here())})")
