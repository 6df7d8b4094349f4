"""Where DraftGate keeps files it can rebuild: dequantized weights, compiled kernels."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/draftgate``, else ``~/.cache/draftgate``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "draftgate"
