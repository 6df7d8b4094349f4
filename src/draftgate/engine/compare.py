"""Run one request to its end and compare token lists: what the lossless canary and
``check-lossless`` share (speculative output against the same back end's plain decoding)."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

from draftgate.engine.backend import Backend, Chunk
from draftgate.types import SamplingParams

__all__ = ["collect", "first_difference", "RUN_TIMEOUT_S"]


RUN_TIMEOUT_S = 120.0  # the longest wait for one chunk


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first position where a and b differ (a length difference counts); None: identical.
    Token lists here; the bench compares text by character with it too."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def collect(
    engine: Backend, prompt_ids: list[int], params: SamplingParams, speculate: bool, timeout_s: float = RUN_TIMEOUT_S
) -> tuple[list[int], Chunk]:
    """Run one request to its end: (every token, the final chunk with finish reason and stats).

    Raises what ``submit`` raises (bad request, capacity) and TimeoutError when a chunk takes
    longer than ``timeout_s``; the request is cancelled on the way out either way.
    """
    out: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
    cancel = engine.submit(list(prompt_ids), params, out.put, speculate=speculate)
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
