"""Arms: named configurations the benchmark compares side by side.

An arm turns a chat into a stream of :class:`Piece` s; the runner timestamps each
piece as it arrives. The names an arm may have are in :mod:`draftgate.bench.arm_spec`;
this module builds them: the in-process engine here, external servers in
:mod:`draftgate.bench.remote`, peer implementations in :mod:`draftgate.bench.peers`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from draftgate.bench.arm_spec import Arm, ArmError, ArmKind, ArmSpec, Piece, parse_arm, parse_arms
from draftgate.bench.peers import build_peer
from draftgate.bench.remote import OpenAIArm
from draftgate.engine import Engine, EngineConfig, build_engine
from draftgate.models.loader import LoadedModel
from draftgate.models.tokenizer import Message
from draftgate.types import SamplingParams

__all__ = ["ArmError", "ArmKind", "ArmSpec", "Arm", "Piece", "EngineArm", "parse_arm", "parse_arms", "build_arms"]


class EngineArm:
    """The in-process engine; every engine arm shares the one loaded model's weights."""

    def __init__(self, spec: ArmSpec, engine: Engine) -> None:
        self.spec = spec
        self.engine = engine

    async def stream(self, messages: list[Message], params: SamplingParams) -> AsyncIterator[Piece]:
        async for c in self.engine.generate(messages, params):
            if c.finish_reason in ("error", "abort"):
                raise ArmError(f"arm {self.spec.name}: request ended with {c.finish_reason}: {c.error or ''}")
            yield Piece(len(c.token_ids), c.text, list(c.token_ids), c.stats)

    def new_run(self) -> None:
        """The drafter forgets earlier runs' answers (``Engine.forget_finished``)."""
        self.engine.forget_finished()

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        self.engine.shutdown()


def _engine_arm(spec: ArmSpec, base: EngineConfig, loaded: LoadedModel) -> EngineArm:
    assert spec.drafter is not None
    k_max = max(base.k_max, spec.k or 0)
    cfg = replace(base, drafter=spec.drafter, k=spec.k, k_max=k_max)
    if spec.draft_model is not None:
        cfg = replace(cfg, draft_model=spec.draft_model)
    if spec.draft_head is not None:
        cfg = replace(cfg, draft_head=spec.draft_head)
    if spec.draft_branch is not None:
        cfg = replace(cfg, draft_branch=spec.draft_branch)
    try:
        engine = build_engine(cfg.validate(), loaded=loaded)
    except (ImportError, ValueError) as e:
        raise ArmError(f"arm {spec.name}: cannot build the engine: {e}") from e
    return EngineArm(spec, engine)


def build_arms(specs: tuple[ArmSpec, ...], base: EngineConfig, loaded: LoadedModel) -> dict[str, Arm]:
    """Build every arm (engine arms share ``loaded``); on failure, close those already built."""
    arms: dict[str, Arm] = {}
    try:
        for s in specs:
            if s.kind == ArmKind.ENGINE:
                arms[s.name] = _engine_arm(s, base, loaded)
            elif s.kind == ArmKind.OPENAI:
                arms[s.name] = OpenAIArm(s, loaded.tokenizer)
            else:
                arms[s.name] = build_peer(s, loaded, base.device)
    except BaseException:
        for a in arms.values():
            a.close()
        raise
    return arms
