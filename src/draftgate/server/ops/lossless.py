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

__all__ = ["LosslessResult", "rerun_plain", "first_difference", "collect"]

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
    try:
        tokens, last = collect(backend, prompt_ids, params, speculate=False)
    except (BadRequestError, CapacityError, ValueError, TimeoutError):
        return None
    if last.finish_reason not in ("stop", "length"):
        return None
    return LosslessResult(request_id, first_difference(expected, tokens))


def collect(
    backend: Backend, prompt_ids: list[int], params: SamplingParams, speculate: bool, timeout_s: float = RUN_TIMEOUT_S
) -> tuple[list[int], Chunk]:
    """Run one request to its end: (every token, the final chunk with finish reason and stats).

    Raises what ``submit`` raises (bad request, capacity) and TimeoutError when a chunk takes
    longer than ``timeout_s``; the request is cancelled on the way out either way.
    """
    out: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
    cancel = backend.submit(list(prompt_ids), params, out.put, speculate=speculate)
    backend.start()
    tokens: list[int] = []
    try:
        while True:
            try:
                c = out.get(timeout=timeout_s)
            except queue.Empty:
                raise TimeoutError(f"no output from the back end for {timeout_s:.0f} s") from None
            tokens.extend(c.token_ids)
            if c.finish_reason is not None:
                return tokens, c
    finally:
        cancel()
