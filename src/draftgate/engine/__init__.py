"""Requests, continuous batching, the speculative step, adaptive K, and the round-target seam."""

from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.engine.costs import CostModel
from draftgate.engine.engine import Chunk, Completion, Engine
from draftgate.engine.factory import build_engine
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.scored_target import ScoredTarget, Scorer, verify_choices
from draftgate.engine.sequence import IncrementalText, StopChecker
from draftgate.engine.session_host import SessionHost
from draftgate.engine.target import (
    NotNow,
    RoundDone,
    RoundTarget,
    RoundWork,
    TargetInfo,
    check_prompt,
)

__all__ = [
    "Chunk",
    "Completion",
    "CostModel",
    "DrafterKind",
    "Engine",
    "EngineConfig",
    "IncrementalText",
    "build_engine",
    "LocalTarget",
    "NotNow",
    "RoundDone",
    "RoundTarget",
    "RoundWork",
    "ScoredTarget",
    "Scorer",
    "SessionHost",
    "StopChecker",
    "TargetInfo",
    "check_prompt",
    "verify_choices",
]
