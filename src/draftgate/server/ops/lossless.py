"""Lossless canary: re-run a greedy speculative request plainly and compare token for token.

Runs on a background worker at low priority: it waits (bounded) until the back
end has no queued requests before submitting, and submits with
``speculate=False`` so the reference is plain decoding on the same target. Every
back end is the engine over a round target, so this works on every route kind
(embedded, gRPC workers, an OpenAI-compatible server).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from draftgate.engine import Chunk
from draftgate.errors import BadRequestError, CapacityError
from draftgate.server.routes import Backend
from draftgate.types import SamplingParams

__all__ = ["LosslessResult", "rerun_plain", "first_difference"]

IDLE_WAIT_S = 30.0  # the most a check waits for the back end's queue to empty
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LosslessResult:
    request_id: str
    first_diff: int | None  # first output position where the two differ; None: identical


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rerun_plain(
    backend: Backend, prompt_ids: list[int], params: SamplingParams, expected: list[int], request_id: str
) -> LosslessResult | None:
    """Plain greedy decoding of the same prompt, compared with ``expected``; None if it could not run."""
    deadline = time.monotonic() + IDLE_WAIT_S
    while backend.num_waiting > 0:  # low priority: live traffic first
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
    out: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
    try:
        cancel = backend.submit(list(prompt_ids), params, out.put, speculate=False)
    except (BadRequestError, CapacityError, ValueError):
        return None
    backend.start()
    tokens: list[int] = []
    try:
        while True:
            c = out.get(timeout=RUN_TIMEOUT_S)
            tokens.extend(c.token_ids)
            if c.finish_reason is not None:
                break
    except queue.Empty:
        return None
    finally:
        cancel()
    if c.finish_reason not in ("stop", "length"):
        return None
    return LosslessResult(request_id, first_difference(expected, tokens))
