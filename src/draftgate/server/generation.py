"""One request on a route: submit to the back end, then answer as one JSON body or as SSE.

The request is submitted *before* any byte of the answer is sent, so bad input
(400) and a full queue (429) keep their status codes even for streams. Every
path out of a stream (finish, engine error, client disconnect) cancels the
back-end request in a ``finally``; the engine then frees its KV blocks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from draftgate.engine import Chunk, ChunkStream
from draftgate.errors import BadRequestError, CapacityError
from draftgate.server.api_errors import APIError
from draftgate.server.metrics import RequestTrace
from draftgate.server.render import SSE_DONE, Format, speculative_json, sse
from draftgate.server.routes import Route
from draftgate.types import SamplingParams

__all__ = ["Job", "open_stream", "collect", "sse_events", "RETRY_AFTER_S"]

RETRY_AFTER_S = 1


def open_stream(route: Route, prompt_ids: list[int], params: SamplingParams, speculate: bool = True) -> ChunkStream:
    """Submit; ``speculate=False`` asks for plain decoding (a canary's control arm, a lossless re-run)."""
    try:
        return route.engine.stream(prompt_ids, params, speculate)
    except CapacityError as e:
        raise APIError(429, str(e), code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except (BadRequestError, ValueError) as e:
        raise APIError(400, str(e), code="invalid_value") from None


@dataclass
class Job:
    """Everything one answer needs: where it runs, how it is rendered, what is measured."""

    route: Route
    fmt: Format
    prompt_ids: list[int]
    trace: RequestTrace
    params: SamplingParams | None = None
    speculate: bool = True  # the arm it runs in
    on_done: Callable[[Job, Chunk], None] | None = None  # after a stop/length finish (ops hooks)
    output_ids: list[int] = field(default_factory=list)

    def done(self, c: Chunk) -> None:
        if self.on_done is not None:
            self.on_done(self, c)

    def spec(self, c: Chunk) -> dict[str, Any]:
        return speculative_json(c.stats, self.route.drafter_name)


def _failure(c: Chunk) -> APIError:
    if c.finish_reason == "abort":
        return APIError(500, "the request was aborted by the server", code="aborted")
    return APIError(500, f"generation failed: {c.error or 'unknown error'}", code="engine_error")


async def collect(job: Job, stream: ChunkStream) -> dict[str, Any]:
    """Run to the end; the full OpenAI body, or an APIError 500 if the back end failed."""
    parts: list[str] = []
    n = 0
    finished = False
    try:
        while True:
            c = await stream.next()
            n += len(c.token_ids)
            job.trace.tokens(len(c.token_ids))
            job.output_ids.extend(c.token_ids)
            parts.append(c.text)
            if c.finish_reason is not None:
                finished = True
                break
    finally:
        stream.cancel()
        if not finished:
            job.trace.finish("abort", len(job.prompt_ids), n, None)
    if c.finish_reason not in ("stop", "length"):
        job.trace.finish("error", len(job.prompt_ids), n, c.stats)
        raise _failure(c)
    job.trace.finish(c.finish_reason, len(job.prompt_ids), n, c.stats)
    job.done(c)
    return job.fmt.response("".join(parts), c.finish_reason, len(job.prompt_ids), n, job.spec(c))


async def sse_events(job: Job, stream: ChunkStream) -> AsyncIterator[str]:
    """OpenAI's stream: chunks, a final chunk with finish_reason (+ speculative), usage, [DONE]."""
    fmt, n, finished = job.fmt, 0, False
    try:
        first = fmt.first_chunk()
        if first is not None:
            yield first
        while True:
            c = await stream.next()
            n += len(c.token_ids)
            job.trace.tokens(len(c.token_ids))
            job.output_ids.extend(c.token_ids)
            if c.finish_reason not in (None, "stop", "length"):
                finished = True
                job.trace.finish("error", len(job.prompt_ids), n, c.stats)
                yield sse(_failure(c).body())  # the openai client raises APIError on this event
                return
            if c.text:
                yield fmt.delta_chunk(c.text)
            if c.finish_reason is not None:
                finished = True
                job.trace.finish(c.finish_reason, len(job.prompt_ids), n, c.stats)
                job.done(c)
                yield fmt.final_chunk(c.finish_reason, job.spec(c))
                if fmt.include_usage:
                    yield fmt.usage_chunk(len(job.prompt_ids), n)
                yield SSE_DONE
                return
    finally:  # finish, error, or the client went away (CancelledError / GeneratorExit)
        stream.cancel()
        if not finished:
            job.trace.finish("abort", len(job.prompt_ids), n, None)
