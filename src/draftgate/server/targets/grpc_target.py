"""GrpcTarget: the round target on `draftgate serve-target` workers (one session per sequence).

The request loop is the engine's (``Engine(GrpcTarget(...), drafter)``); this module only
speaks to the workers:

1. ``open``: a session on the least-loaded healthy worker (a worker that fails before it
   answers is marked down and the next one is tried); the worker prefills and answers with the
   first token;
2. ``run``: every sequence's drafts (and sparse q for sampled drafts) go out on their sessions
   at once, so a worker batches the rounds it receives together; the answers (emitted tokens,
   accepted count) come back as they finish and the call returns when all have;
3. ``close``: the session's stream is cancelled, which frees its KV on the worker.

A worker that fails mid-session ends that sequence with an error (and is marked down, retried
after a back-off); the others go on. One background thread runs the asyncio loop that owns the
channels (grpc.aio objects are bound to one loop); the engine thread waits on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from draftgate.engine import Round, TargetInfo, check_prompt
from draftgate.models.tokenizer import TextTokenizer
from draftgate.server.proto import target_pb2 as pb
from draftgate.server.proto.wire import GRPC_PREFIX, WireStats, params_to_pb, round_to_pb
from draftgate.server.targets.grpc_pool import NoWorkerError, WorkerHandle, WorkerPool
from draftgate.types import SamplingParams

__all__ = ["GrpcTarget", "RemoteError"]

log = logging.getLogger("draftgate.remote")
T = TypeVar("T")
# Status codes that say the worker (not the request) is at fault: stop sending it sessions for a while.
_WORKER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class RemoteError(RuntimeError):
    """A session call failed; ``code`` says whose fault it was."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"target worker: {code.name}: {details}")
        self.code = code

    @property
    def worker_fault(self) -> bool:
        return self.code in _WORKER_FAULTS


@dataclass
class _Session:
    worker: WorkerHandle
    call: grpc.aio.StreamStreamCall


class GrpcTarget:
    def __init__(
        self,
        targets: Sequence[str],
        tokenizer: TextTokenizer,
        rpc_timeout_s: float = 60.0,
        retry_s: float = 1.0,
        health_interval_s: float = 5.0,
    ) -> None:
        self.tokenizer = tokenizer
        self.pool = WorkerPool(targets, retry_s=retry_s, min_vocab=tokenizer.vocab_size)
        self.rpc_timeout_s = rpc_timeout_s
        self.health_interval_s = health_interval_s
        self.wire = WireStats()
        self._sessions: dict[int, _Session] = {}  # loop thread only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def info(self) -> TargetInfo:
        return TargetInfo("grpc", self._vocab(), self.pool.max_context)

    def _vocab(self) -> int:
        known = [w.info.vocab_size for w in self.pool.workers if w.info is not None]
        return min(known) if known else self.tokenizer.vocab_size

    # ------------------------------------------------------------------ RoundTarget

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        check_prompt(prompt_ids, params.max_new_tokens, self.tokenizer.vocab_size, self.pool.max_context)

    def open(self, rnd: Round) -> None:
        assert rnd.params.seed is not None, "the engine gives every request a seed (worker and drafter share it)"
        self._call(self._open(rnd))

    def run(self, rounds: Sequence[Round]) -> None:
        self._call(self._run(rounds))

    def close(self, seq_id: int) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self._close(seq_id), loop).result(timeout=self.rpc_timeout_s)
            except RuntimeError:
                pass  # the loop stopped meanwhile: shutdown closed every session

    def kv_stats(self) -> dict[str, int]:
        """The workers' KV blocks (sum of their last Health answers)."""
        return self.pool.kv_stats()

    def shutdown(self) -> None:
        """Close every session and channel, stop the loop (a later call starts it again)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    # ---------------------------------------------------------------------- the loop

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop()).result()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run_loop, args=(self._loop, ready), name="draftgate-grpc", daemon=True
                )
                self._thread.start()
                ready.wait()
            return self._loop

    def _run_loop(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        health = loop.create_task(self._health_loop())
        try:
            loop.run_forever()
        finally:
            health.cancel()
            loop.run_until_complete(asyncio.gather(health, return_exceptions=True))
            loop.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.pool.probe_all()

    async def _open(self, rnd: Round) -> None:
        """A session on the least-loaded worker; a worker that fails here is skipped."""
        msg = pb.SessionRequest(
            open=pb.Open(prompt=list(rnd.history), params=params_to_pb(rnd.params), max_draft_tokens=rnd.k_max)
        )
        tried: list[WorkerHandle] = []
        while True:
            try:
                w, stub = await self.pool.acquire(exclude=tried)
            except NoWorkerError as e:
                rnd.fail(str(e))
                return
            call = stub.Session()
            try:
                first = await self._exchange(call, msg)
            except RemoteError as e:
                call.cancel()
                self.pool.release(w)
                if not e.worker_fault:
                    rnd.fail(str(e))
                    return
                self.pool.mark_down(w, str(e))
                tried.append(w)
                continue
            except BaseException:
                call.cancel()
                self.pool.release(w)
                raise
            self.pool.mark_ok(w)
            self._sessions[rnd.seq_id] = _Session(w, call)
            rnd.done(list(first.tokens))
            return

    async def _run(self, rounds: Sequence[Round]) -> None:
        await asyncio.gather(*(self._round(r) for r in rounds))

    async def _round(self, r: Round) -> None:
        sess = self._sessions.get(r.seq_id)
        if sess is None:
            r.fail("the target session is gone")
            return
        msg = round_to_pb(r.draft)
        k = len(r.draft.token_ids)
        try:
            resp = await self._exchange(sess.call, msg)
            a = resp.num_accepted
            if a > k or len(resp.tokens) > a + 1 or (not resp.tokens and not resp.finish_reason):
                raise RemoteError(
                    grpc.StatusCode.INTERNAL, f"malformed round answer ({len(resp.tokens)} tokens, {a} accepted of {k})"
                )
        except RemoteError as e:
            if e.worker_fault:
                self.pool.mark_down(sess.worker, str(e))
            await self._close(r.seq_id)
            r.fail(str(e))
            return
        sent, got = msg.ByteSize() + GRPC_PREFIX, resp.ByteSize() + GRPC_PREFIX
        self.wire.rounds += 1
        self.wire.request_bytes += sent
        self.wire.response_bytes += got
        self.wire.max_round_bytes = max(self.wire.max_round_bytes, sent + got)
        # The worker cut its tokens where plain decoding stops; the engine's identical cut keeps them.
        r.done(list(resp.tokens), a)

    async def _exchange(self, call: grpc.aio.StreamStreamCall, msg: pb.SessionRequest) -> pb.SessionResponse:
        """Send one message and read its answer; every failure becomes a RemoteError."""
        try:
            resp = await asyncio.wait_for(_write_read(call, msg), self.rpc_timeout_s)
        except grpc.aio.AioRpcError as e:
            raise RemoteError(e.code(), e.details() or "") from None
        except asyncio.InvalidStateError:  # the call already ended: its status says why
            raise RemoteError(await call.code(), await call.details()) from None
        except TimeoutError:
            raise RemoteError(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {self.rpc_timeout_s:g} s") from None
        if resp is grpc.aio.EOF:
            code = await call.code()
            raise RemoteError(
                grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code, "the session ended early"
            )
        return resp

    async def _close(self, seq_id: int) -> None:
        sess = self._sessions.pop(seq_id, None)
        if sess is not None:
            sess.call.cancel()  # the worker frees the session's KV
            self.pool.release(sess.worker)

    async def _close_all(self) -> None:
        for sid in list(self._sessions):
            await self._close(sid)
        await self.pool.close()


async def _write_read(call: grpc.aio.StreamStreamCall, msg: pb.SessionRequest) -> pb.SessionResponse:
    await call.write(msg)
    return await call.read()
