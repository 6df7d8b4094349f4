"""Helpers of the engine tests: request sinks, batch runners, leak checks, test drafters, prompts."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from draftgate.drafters.base import Abilities, Draft, Drafter, DraftRequest
from draftgate.engine import Chunk, CostModel, DrafterKind, Engine, EngineConfig
from draftgate.engine.controller import FEW_PLAIN_TIMINGS
from draftgate.engine.factory import build_drafter
from draftgate.models.loader import LoadedModel
from draftgate.types import SamplingParams, SpecStats

WAIT_S = 180.0  # a generous bound on any one request set: a hang fails, never blocks CI


@dataclass
class Result:
    """Everything one request sent to its sink."""

    chunks: list[Chunk] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)

    def __call__(self, c: Chunk) -> None:
        self.chunks.append(c)
        if c.finish_reason is not None:
            self.done.set()

    @property
    def token_ids(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.chunks)

    @property
    def finish_reason(self) -> str | None:
        return self.chunks[-1].finish_reason if self.chunks else None

    @property
    def stats(self) -> SpecStats:
        s = self.chunks[-1].stats
        assert s is not None
        return s


def run_batch(
    engine: Engine, prompts: Sequence[list[int]], params: SamplingParams | Sequence[SamplingParams]
) -> list[Result]:
    """Submit every request at once, then wait for all: the loop admits one a turn, so they share rounds."""
    ps = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    results = [Result() for _ in prompts]
    for ids, p, r in zip(prompts, ps, results, strict=True):
        engine.submit(list(ids), p, r)
    for r in results:
        assert r.done.wait(WAIT_S), "request never finished"
    for r in results:
        assert r.finish_reason != "error", r.chunks[-1].error
    return results


def gather_generate(engine: Engine, prompts: Sequence[list[int]], params: SamplingParams) -> list[list[int]]:
    """The async API: asyncio.gather over generate(), one stream per prompt."""

    async def one(ids: list[int]) -> list[int]:
        out: list[int] = []
        async for c in engine.generate(ids, params):
            assert c.finish_reason != "error", c.error
            out.extend(c.token_ids)
        return out

    async def all_() -> list[list[int]]:
        return list(await asyncio.wait_for(asyncio.gather(*(one(list(p)) for p in prompts)), WAIT_S))

    return asyncio.run(all_())


def wait_idle(engine: Engine, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while engine.num_running or engine.num_waiting or engine.runner.kv.num_sequences:
        assert time.monotonic() < deadline, "engine never became idle"
        time.sleep(0.005)


def assert_no_leaks(engine: Engine) -> None:
    """Every request has ended: no sequence registered, blocks free or held only by the prefix cache."""
    wait_idle(engine)
    engine.runner.kv.check_no_leaks()
    assert engine.target.reserved_blocks == 0, f"engine still reserves {engine.target.reserved_blocks} blocks"


def spec_engine(
    base: Engine, loaded: LoadedModel, kind: DrafterKind, k: int | None, k_max: int = 8, draft_head: str | None = None
) -> Engine:
    """An engine with drafter `kind` and K over base's runner (what build_engine does, minus the weights copy)."""
    cfg = EngineConfig(drafter=kind, k=k, k_max=k_max, draft_head=draft_head).validate()
    drafter = build_drafter(cfg, loaded)
    return Engine(base.runner, drafter, k=cfg.k if drafter else 0, k_max=cfg.k_max, max_batch=base.max_batch)


def engine_with(base: Engine, drafter: Drafter | None, k: int | None, k_max: int = 8) -> Engine:
    """An engine over base's runner with a test-local drafter."""
    return Engine(base.runner, drafter, k=k, k_max=k_max, max_batch=base.max_batch)


@contextmanager
def running(engine: Engine) -> Iterator[Engine]:
    """Use the engine (it starts with its first request); on exit check nothing leaked and stop its thread."""
    try:
        yield engine
        assert_no_leaks(engine)
    finally:
        engine.shutdown()


def run_batch_allow_error(eng: Engine, prompts: Sequence[list[int]], params: SamplingParams) -> list[Result]:
    results = [Result() for _ in prompts]
    for ids, r in zip(prompts, results, strict=True):
        eng.submit(ids, params, r)
    for r in results:
        assert r.done.wait(WAIT_S)
    return results


class OracleDrafter:
    """Drafts the reference continuation (known in advance), corrupting each token with probability `noise`.

    noise = 0: every draft is accepted, so blocks run through EOS and stop strings.
    noise > 0: acceptance stops at random positions, exercising rollback at every offset.
    """

    name = "oracle"
    sampled_q = False
    abilities = Abilities()

    def __init__(self, refs: Sequence[list[int]], noise: float = 0.0, seed: int = 0) -> None:
        self.refs = [list(r) for r in refs]
        self.noise = noise
        self.rng = random.Random(seed)
        self.rounds: list[tuple[int, int]] = []  # (drafted, accepted) as observed

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            h = list(r.tokens)
            ref = next((x for x in self.refs if x[: len(h)] == h), [])
            cont = ref[len(h) : len(h) + r.k]
            cont = [self.rng.randrange(3, 96) if self.rng.random() < self.noise else t for t in cont]
            out.append(Draft(token_ids=cont))
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        self.rounds.append((num_drafted, num_accepted))

    def release(self, seq_id: int) -> None:
        pass


class FrozenCost(CostModel):
    """Forward prices timed once, never re-measured, drafts free: the controllers' choices then
    follow acceptance alone, not this machine's load (a loaded suite once halved the junk probes)."""

    def __init__(self) -> None:
        super().__init__()
        for _ in range(FEW_PLAIN_TIMINGS):  # enough timings that plain's price needs no re-measuring
            for n in range(1, 18):
                super().observe_forward(n, 1.0 + 0.05 * (n - 1))

    def observe_forward(self, num_tokens: int, seconds: float) -> None:
        pass

    def observe_draft(self, drafter: str, num_tokens: int, seconds: float) -> None:
        pass

    def observe_catch_up(self, drafter: str, num_tokens: int, seconds: float) -> None:
        pass


def tiny_prompts(n: int, seed: int) -> list[list[int]]:
    """Random prompts with repeated segments (so prompt lookup finds something), 5..40 tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        unit = rng.choices(range(3, 96), k=rng.randint(2, 9))
        noise = rng.choices(range(3, 96), k=rng.randint(0, 6))
        out.append(((unit * 6)[: rng.randint(4, 30)] + noise + unit)[:40])
    return out


TINY_PROMPTS = tiny_prompts(10, seed=2024)
TINY_NEW = 40


TINY_SETTINGS = {
    "greedy": SamplingParams(max_new_tokens=TINY_NEW, ignore_eos=True),
    "t0.8": SamplingParams(temperature=0.8, seed=5, max_new_tokens=TINY_NEW, ignore_eos=True),
    "topk20": SamplingParams(temperature=1.0, top_k=20, seed=6, max_new_tokens=TINY_NEW, ignore_eos=True),
    "topp0.9": SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_new_tokens=TINY_NEW, ignore_eos=True),
}
