"""Engine fixtures: a plain engine on the real model (shared), engines on the tiny model (leak-checked).

Building a ModelRunner on SmolLM2 copies ~0.5 GB of weights, so the real-model
tests share one plain engine (session scope) and run every drafter/K variant as
another Engine over its runner, one engine busy at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from engine_support import TINY_PROMPTS, TINY_SETTINGS, assert_no_leaks

from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.models.loader import LoadedModel

# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def real_engine(real_model: LoadedModel) -> Iterator[Engine]:
    """Plain decoding on SmolLM2; its runner is shared by every real-model engine."""
    cfg = EngineConfig(drafter=DrafterKind.NONE, num_blocks=160, block_size=16, max_batch=8)
    engine = build_engine(cfg, loaded=real_model)
    yield engine
    engine.shutdown()


@pytest.fixture
def make_tiny(tiny_model: LoadedModel) -> Iterator[Callable[..., Engine]]:
    """build_engine on the tiny model; every engine made is leak-checked and shut down at teardown."""
    made: list[Engine] = []

    def make(drafter: DrafterKind = DrafterKind.NONE, k: int | None = None, **kw: object) -> Engine:
        kw.setdefault("num_blocks", 256)
        kw.setdefault("block_size", 8)
        engine = build_engine(EngineConfig(drafter=drafter, k=k, **kw), loaded=tiny_model)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    try:
        # Every request ended: nothing registered, blocks free or held only by the prefix cache.
        for e in made:
            deadline = time.monotonic() + 30
            while e.num_running or e.num_waiting or e.runner.kv.num_sequences:
                assert time.monotonic() < deadline, "engine never became idle"
                time.sleep(0.005)
            e.runner.kv.check_no_leaks()
    finally:
        for e in made:
            e.shutdown()


@pytest.fixture(scope="module")
def tiny_plain(tiny_model: LoadedModel) -> dict[str, list[list[int]]]:
    """Plain decoding references, one request at a time: greedy and each seeded sampling setting."""
    eng = build_engine(EngineConfig(drafter=DrafterKind.NONE, num_blocks=256, block_size=8), loaded=tiny_model)
    try:
        out = {}
        for name, params in TINY_SETTINGS.items():
            out[name] = [eng.complete(p, params).token_ids for p in TINY_PROMPTS]
        assert_no_leaks(eng)
        return out
    finally:
        eng.shutdown()
