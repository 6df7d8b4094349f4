"""The vLLM proposer's logic, tested without vLLM (its live tests need vLLM's own environment)."""

from __future__ import annotations

import sys
from pathlib import Path

# serve_app (a real uvicorn server on loopback) lives with the server tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))
