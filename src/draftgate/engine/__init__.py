"""Requests, continuous batching, the speculative step, adaptive K."""

from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.engine.engine import Chunk, Completion, Engine
from draftgate.engine.factory import build_engine

__all__ = ["Chunk", "Completion", "DrafterKind", "Engine", "EngineConfig", "build_engine"]
