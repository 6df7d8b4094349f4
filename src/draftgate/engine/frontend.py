"""What callers use on any back end: encode, generate (async), complete (blocking).

Built once on top of two primitives a back end provides: ``submit(ids, params,
sink) -> cancel`` and ``start()``. The embedded Engine and remote back ends
(gRPC target workers) share it, so text chunks and errors look the same everywhere.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import Message, TextTokenizer
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Chunk", "Completion", "Frontend", "Sink", "check_messages", "is_ids"]


@dataclass(frozen=True)
class Chunk:
    """What one request gets after a round: new tokens, their text, and at the end the reason."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    stats: SpecStats | None = None  # set on the final chunk
    prompt_tokens: int = 0


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


class Frontend:
    tokenizer: TextTokenizer

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True
    ) -> Callable[[], None]:
        """Queue a request; returns a cancel function (``speculate=False``: it decodes plainly)."""
        raise NotImplementedError

    def start(self) -> Any:
        raise NotImplementedError

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

    async def generate(self, prompt: Prompt, params: SamplingParams, raw: bool = False) -> AsyncIterator[Chunk]:
        """Stream chunks for one request; cancelling the iterator cancels the request."""
        ids = self._ids(prompt, raw)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Chunk] = asyncio.Queue()

        def sink(c: Chunk) -> None:
            try:
                loop.call_soon_threadsafe(q.put_nowait, c)
            except RuntimeError:  # the caller's loop is gone: nobody is listening
                pass

        cancel = self.submit(ids, params, sink)
        self.start()
        try:
            while True:
                c = await q.get()
                yield c
                if c.finish_reason is not None:
                    return
        finally:
            cancel()

    def complete(self, prompt: Prompt, params: SamplingParams, raw: bool = False, on_chunk: Sink | None = None) -> Completion:
        """Blocking: run one request to the end (RuntimeError on an error chunk)."""
        ids = self._ids(prompt, raw)
        q: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        t0 = time.perf_counter()
        first = None
        self.submit(ids, params, q.put)
        self.start()
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
