"""Lossless canary: re-run a greedy speculative request plainly and compare token for token.

Runs on a background worker at low priority: it waits (bounded) until the back
end has no queued requests before submitting, and submits with
``speculate=False`` so the reference is plain decoding on the same target. Every
back end is the engine over a round target, so this works on every route kind
(embedded, gRPC workers, an OpenAI-compatible server).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from draftgate.engine.compare import collect, first_difference
from draftgate.errors import BadRequestError, CapacityError
from draftgate.server.routes import Backend
from draftgate.types import SamplingParams

__all__ = ["LosslessResult", "rerun_plain", "first_difference"]

IDLE_WAIT_S = 30.0  # the most a check waits for the back end's queue to empty


@dataclass(frozen=True)
class LosslessResult:
    request_id: str
    first_diff: int | None  # first output position where the two differ; None: identical


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
