"""Requests, continuous batching, the speculative step, adaptive K, and the round-target seam."""

from draftgate.engine.backend import Backend, Chunk, ChunkStream, Completion, Sink
from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.engine.costs import CostModel
from draftgate.engine.engine import Engine, Submitted
from draftgate.engine.factory import build_engine
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.round import Round
from draftgate.engine.scored_target import ScoredTarget, Scorer, verify_choices
from draftgate.engine.sequence import IncrementalText, StopChecker
from draftgate.engine.session_host import SessionHost
from draftgate.engine.target import DraftPricer, NotNow, RoundTarget, TargetInfo, check_prompt

__all__ = [
    "Backend",
    "Chunk",
    "ChunkStream",
    "Completion",
    "CostModel",
    "DraftPricer",
    "DrafterKind",
    "Engine",
    "EngineConfig",
    "IncrementalText",
    "build_engine",
    "LocalTarget",
    "NotNow",
    "Round",
    "RoundTarget",
    "ScoredTarget",
    "Scorer",
    "SessionHost",
    "Sink",
    "StopChecker",
    "Submitted",
    "TargetInfo",
    "check_prompt",
    "verify_choices",
]
