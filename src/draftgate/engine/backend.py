"""The back end: what the gateway and the tools use of anything that generates, written once.

A back end provides ``submit(ids, params, sink) -> cancel`` (thread-safe; it starts whatever it
runs on) and says what it is (speculation switch, K, costs, queue, KV). On top of that this base
class gives every back end the same ``encode``, ``stream`` (chunks on an asyncio loop: the
gateway's SSE and ``generate``), ``generate`` (an async iterator) and ``complete`` (blocking), so
text chunks and errors look the same everywhere. Implementations: the ``Engine`` over any round
target, and ``integrations.vllm.gateway.plugin_route.VllmPluginBackend`` (a vLLM that drafts and verifies
with DraftGate's proposer).
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from draftgate.drafters.base import Drafter
from draftgate.engine.costs import CostModel
from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import Message, TextTokenizer
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Backend", "Chunk", "Completion", "Sink", "ChunkStream", "check_messages", "is_ids"]


@dataclass(frozen=True)
class Chunk:
    """What one request gets after a round: new tokens, their text, and at the end the reason."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    stats: SpecStats | None = None  # set on the final chunk
    prompt_tokens: int = 0
    accepted: int = 0  # drafts the round that made these tokens accepted


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str
    stats: SpecStats
    elapsed_s: float
    first_token_s: float

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


Sink = Callable[[Chunk], None]
Prompt = str | Sequence[Message] | list[int]


class ChunkStream:
    """One submitted request's chunks, handed from the back end's thread to an asyncio loop."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self._cancel: Callable[[], None] = lambda: None

    def sink(self, c: Chunk) -> None:  # runs on the back end's thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, c)
        except RuntimeError:  # the event loop is gone: nobody is listening
            pass

    async def next(self) -> Chunk:
        return await self._queue.get()

    def cancel(self) -> None:
        """Idempotent; after the request finished it does nothing."""
        self._cancel()


class Backend:
    """A generation back end. Subclasses implement ``submit``, ``shutdown`` and the facts below."""

    tokenizer: TextTokenizer
    speculation_enabled: bool  # the runtime switch: False decodes every request plainly
    k: int | None  # a fixed K (None: adaptive)
    k_max: int
    cost: CostModel | None  # measured forward and draft costs (None: it measures none)
    drafter: Drafter | None
    max_context: int | None  # prompt + completion tokens it accepts (None: unknown)

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True
    ) -> Callable[[], None]:
        """Queue a request; returns a cancel function (``speculate=False``: it decodes plainly).
        Raises BadRequestError (or ValueError) on bad input, CapacityError when the queue is full."""
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError

    @property
    def num_running(self) -> int:
        raise NotImplementedError

    @property
    def num_waiting(self) -> int:
        raise NotImplementedError

    def kv_stats(self) -> dict[str, int]:
        return {}

    def verification_counts(self) -> dict[str, int]:
        """Counts a target that verifies on another server keeps (near ties, contradicted and unconfirmed
        tokens: ``integrations.vllm.gateway.target``); {} for one whose verification is exact in process."""
        return {}

    # ---------------------------------------------------------------- written once

    def encode(self, prompt: str | Sequence[Message], raw: bool = False) -> list[int]:
        if isinstance(prompt, str):
            msgs = [{"role": "user", "content": prompt}]
            ids = self.tokenizer.encode(prompt) if raw else self.tokenizer.encode_chat(msgs)
        else:
            check_messages(prompt)
            ids = self.tokenizer.encode_chat(prompt)
        if not ids:
            raise BadRequestError("the prompt is empty")
        return ids

    def _ids(self, prompt: Prompt, raw: bool) -> list[int]:
        return list(prompt) if is_ids(prompt) else self.encode(prompt, raw)  # type: ignore[arg-type]

    def stream(self, prompt_ids: list[int], params: SamplingParams, speculate: bool = True) -> ChunkStream:
        """Submit from inside an asyncio loop; the request's chunks arrive on that loop."""
        s = ChunkStream()
        s._cancel = self.submit(prompt_ids, params, s.sink, speculate)
        return s

    async def generate(self, prompt: Prompt, params: SamplingParams, raw: bool = False) -> AsyncIterator[Chunk]:
        """Stream chunks for one request; cancelling the iterator cancels the request."""
        s = self.stream(self._ids(prompt, raw), params)
        try:
            while True:
                c = await s.next()
                yield c
                if c.finish_reason is not None:
                    return
        finally:
            s.cancel()

    def complete(
        self, prompt: Prompt, params: SamplingParams, raw: bool = False, on_chunk: Sink | None = None
    ) -> Completion:
        """Blocking: run one request to the end (RuntimeError on an error chunk)."""
        ids = self._ids(prompt, raw)
        q: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        t0 = time.perf_counter()
        first = None
        self.submit(ids, params, q.put)
        toks: list[int] = []
        text = []
        while True:
            c = q.get()
            if first is None and c.token_ids:
                first = time.perf_counter() - t0
            if on_chunk is not None:
                on_chunk(c)
            toks.extend(c.token_ids)
            text.append(c.text)
            if c.finish_reason is not None:
                if c.finish_reason == "error":
                    raise RuntimeError(c.error or "generation failed")
                assert c.stats is not None
                el = time.perf_counter() - t0
                return Completion("".join(text), toks, len(ids), c.finish_reason, c.stats, el, first or el)


def is_ids(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(t, int) for t in prompt)


def check_messages(messages: Sequence[Message]) -> None:
    if not messages:
        raise BadRequestError("messages must not be empty")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequestError("each message needs a string 'role' and a string 'content'")
        if m["role"] not in ("system", "user", "assistant"):
            raise BadRequestError(f"unknown message role {m['role']!r} (use system, user or assistant)")
