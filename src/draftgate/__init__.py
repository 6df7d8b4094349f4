"""DraftGate: lossless speculative decoding (engine, gateway, tools).

The public API for library use; everything else is reachable through its subpackage::

    from draftgate import EngineConfig, DrafterKind, SamplingParams, build_engine

    engine = build_engine(EngineConfig(drafter=DrafterKind.AUTO))
    out = engine.complete("Summarize: ...", SamplingParams(max_new_tokens=128))
"""

from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.errors import BadRequestError, CapacityError, DraftGateError, ModelLoadError
from draftgate.models.loader import load_model
from draftgate.models.runner import Kernels
from draftgate.types import SamplingParams, SpecStats

__version__ = "0.1.0"

__all__ = [
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
