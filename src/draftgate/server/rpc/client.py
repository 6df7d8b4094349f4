"""RemoteTargetEngine: the engine's public surface, with the target on gRPC workers.

The draft loop runs here (any ``Drafter``, under the goodput K controller); the
target runs on ``draftgate serve-target`` workers, one bidirectional stream per
request. Per request:

1. open a session on the least-loaded healthy worker (a worker that fails
   before answering is marked down and the next one is tried); the worker
   prefills and answers with the first token;
2. each round: choose K (controller; the round trip is the forward cost),
   draft locally, send only the K drafts (and sparse q for sampled drafts),
   receive the emitted tokens and the acceptance count;
3. stream text chunks to the caller exactly as ``Engine`` does.

Failures: a drafter that raises, times out or returns an unusable draft costs
that request its drafts (plain decoding from then on; the round still runs, so
no token is lost or repeated). A worker that fails mid-session ends that
request with an ``error`` chunk and is marked down (retried after a back-off);
new sessions go elsewhere. Every way out of a request closes its stream, which
frees its KV on the worker, and releases its drafter state.

One background thread runs an asyncio loop that owns the channels and the
requests; drafter calls run on one helper thread (drafters need not be
thread-safe).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import grpc

from draftgate.drafters.base import Draft, Drafter, DraftRequest
from draftgate.engine.controller import AcceptancePool, CostModel, GoodputController
from draftgate.engine.engine import _Detok  # shared with Engine
from draftgate.engine.frontend import Chunk, Frontend
from draftgate.engine.sequence import StopChecker
from draftgate.errors import BadRequestError, CapacityError
from draftgate.models.tokenizer import TextTokenizer
from draftgate.server.rpc import target_pb2 as pb
from draftgate.server.rpc.pool import NoWorkerError, WorkerHandle, WorkerPool
from draftgate.server.rpc.wire import GRPC_PREFIX, WireStats, check_draft, params_to_pb, round_to_pb
from draftgate.types import SamplingParams, SpecStats

__all__ = ["RemoteTargetEngine", "RemoteError"]

log = logging.getLogger("draftgate.remote")
Sink = Callable[[Chunk], None]
_NO_DRAFT = Draft([])
_ids = itertools.count(1)
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
class _Req:
    prompt: list[int]
    params: SamplingParams
    sink: Sink
    detok: _Detok
    controller: GoodputController | None
    seq_id: int = field(default_factory=lambda: next(_ids))
    history: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    drafter_failed: bool = False
    drafted_last: bool = False  # the previous round drafted (no catch-up in this one's draft time)
    opened: bool = False
    finished: bool = False
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.history = list(self.prompt)


class RemoteTargetEngine(Frontend):
    """Generation against gRPC target workers; the gateway's Backend and Engine's public API."""

    def __init__(
        self,
        targets: Sequence[str],
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_queue: int = 256,
        draft_timeout_s: float | None = None,
        rpc_timeout_s: float = 60.0,
        retry_s: float = 1.0,
        health_interval_s: float = 5.0,
    ) -> None:
        if k is not None and not 0 <= k <= k_max:
            raise ValueError(f"k must be in [0, k_max={k_max}] or None (adaptive), got {k}")
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.k = k
        self.k_max = k_max if drafter is not None else 0
        self.max_queue = max_queue
        # None: a drafter's own ``timeout_s`` if it has one (remote drafters), else no limit.
        self.draft_timeout_s = draft_timeout_s if draft_timeout_s is not None else getattr(drafter, "timeout_s", None)
        self.rpc_timeout_s = rpc_timeout_s
        self.health_interval_s = health_interval_s
        self.pool = WorkerPool(targets, retry_s=retry_s, min_vocab=tokenizer.vocab_size)
        self.cost = CostModel()
        self.acceptance = AcceptancePool(self.k_max)  # new requests start from it
        self.stats = SpecStats(drafter=drafter.name if drafter else "none")
        self.wire = WireStats()
        self.speculation_enabled = drafter is not None
        self._lock = threading.Lock()
        self._running = 0
        self._waiting = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._live: set[asyncio.Task[None]] = set()  # loop thread only
        self._draft_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="draftgate-draft")

    # ----------------------------------------------------------------- public API

    def start(self) -> RemoteTargetEngine:
        with self._lock:
            if self._thread is not None:
                return self
            self._loop = asyncio.new_event_loop()
            ready = threading.Event()
            self._thread = threading.Thread(target=self._run_loop, args=(ready,), name="draftgate-remote", daemon=True)
            self._thread.start()
        ready.wait()
        return self

    def shutdown(self) -> None:
        """Abort every request (each closes its session), close channels, stop the loop."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        self._thread = self._loop = None
        self._draft_pool.shutdown(wait=True)
        self._draft_pool = cf.ThreadPoolExecutor(1, thread_name_prefix="draftgate-draft")  # restartable

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> Callable[[], None]:
        """Queue a request; returns a cancel function. Raises BadRequestError / CapacityError."""
        params.validate()
        V = self.tokenizer.vocab_size
        if not prompt_ids or any(not isinstance(t, int) or not 0 <= t < V for t in prompt_ids):
            raise BadRequestError(f"prompt token ids must be a non-empty list of ids in [0, {V})")
        ctx = self.pool.max_context
        if ctx is not None and len(prompt_ids) + params.max_new_tokens > ctx:
            raise BadRequestError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                f"exceeds the model's context of {ctx} tokens; shorten the prompt or lower max_tokens"
            )
        with self._lock:
            if self._running + self._waiting >= self.max_queue:
                raise CapacityError("too many requests in flight to the target workers; retry later")
            self._waiting += 1
        if params.seed is None:  # one seed for worker and drafter alike
            params = replace(params, seed=random.getrandbits(62))
        ctl = None
        if self.drafter is not None and self.k is None and self.k_max > 0:
            ctl = GoodputController(self.k_max, self.drafter.name, pool=self.acceptance)
        r = _Req(list(prompt_ids), params, sink, _Detok(StopChecker(self.tokenizer, params)), ctl)
        r.stats.drafter = self.stats.drafter
        self.start()
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(self._spawn, r)  # FIFO: the task exists before any cancel arrives

        def cancel() -> None:
            try:
                loop.call_soon_threadsafe(self._cancel, r)
            except RuntimeError:
                pass  # the loop is closed: the request already ended

        return cancel

    def kv_stats(self) -> dict[str, int]:
        """The workers' KV blocks (sum of their last Health answers)."""
        return self.pool.kv_stats()

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def num_waiting(self) -> int:
        return self._waiting

    # ---------------------------------------------------------------- the loop

    def _run_loop(self, ready: threading.Event) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.call_soon(ready.set)
        health = self._loop.create_task(self._health_loop())
        try:
            self._loop.run_forever()
        finally:
            health.cancel()
            self._loop.run_until_complete(asyncio.gather(health, return_exceptions=True))
            self._loop.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.pool.probe_all()

    def _spawn(self, r: _Req) -> None:
        r.task = task = asyncio.get_running_loop().create_task(self._serve(r))
        self._live.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._live.discard(t)
            self._finish(r, "abort")  # no-op unless it was cancelled before it ever ran

        task.add_done_callback(done)

    def _cancel(self, r: _Req) -> None:
        if r.task is not None and not r.finished:
            r.task.cancel()

    async def _close(self) -> None:
        tasks = list(self._live)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.close()

    async def _serve(self, r: _Req) -> None:
        """One request, start to end (see the module docstring)."""
        w: WorkerHandle | None = None
        call: grpc.aio.StreamStreamCall | None = None
        try:
            w, call, first = await self._open(r)
            self._take(r, first)
            while not r.finished:
                await self._round(r, w, call)
        except asyncio.CancelledError:
            self._finish(r, "abort")
        except RemoteError as e:
            if w is not None and e.worker_fault:
                self.pool.mark_down(w, str(e))
            self._finish(r, "error", error=str(e))
        except NoWorkerError as e:
            self._finish(r, "error", error=str(e))
        except Exception as e:  # a bug or a model-side surprise: still a clear end for the caller
            log.exception("request %d failed", r.seq_id)
            self._finish(r, "error", error=f"{type(e).__name__}: {e}")
        finally:
            if call is not None:
                call.cancel()  # the worker frees the session's KV
            if w is not None:
                self.pool.release(w)
            if self.drafter is not None:
                self._draft_pool.submit(_quiet, self.drafter.release, r.seq_id)

    async def _open(self, r: _Req) -> tuple[WorkerHandle, grpc.aio.StreamStreamCall, pb.SessionResponse]:
        """Open the session on the least-loaded worker; a worker that fails here is skipped."""
        msg = pb.SessionRequest(open=pb.Open(prompt=r.prompt, params=params_to_pb(r.params), max_draft_tokens=self.k_max))
        tried: list[WorkerHandle] = []
        while True:
            w, stub = await self.pool.acquire(exclude=tried)
            call = stub.Session()
            try:
                first = await self._exchange(call, msg)
            except RemoteError as e:
                call.cancel()
                self.pool.release(w)
                if not e.worker_fault:
                    raise
                self.pool.mark_down(w, str(e))
                tried.append(w)
                continue
            except BaseException:
                call.cancel()
                self.pool.release(w)
                raise
            self.pool.mark_ok(w)
            with self._lock:
                self._waiting -= 1
                self._running += 1
            r.opened = True
            return w, call, first

    async def _round(self, r: _Req, w: WorkerHandle, call: grpc.aio.StreamStreamCall) -> None:
        """Draft K locally, verify remotely, emit."""
        k = self._choose_k(r)
        d, draft_s = await self._draft(r, k) if k else (_NO_DRAFT, 0.0)
        k = len(d.token_ids)
        msg = round_to_pb(d)
        t0 = time.perf_counter()
        resp = await self._exchange(call, msg)
        rtt = time.perf_counter() - t0
        a = resp.num_accepted
        if a > k or len(resp.tokens) > a + 1 or (not resp.tokens and not resp.finish_reason):
            raise RemoteError(grpc.StatusCode.INTERNAL, f"malformed round answer ({len(resp.tokens)} tokens, {a} accepted of {k})")
        self.cost.observe_forward(k + 1, rtt)
        if k and self.drafter is not None and r.drafted_last:  # steady state only, see Engine._step
            self.cost.observe_draft(self.drafter.name, k, draft_s)
        r.drafted_last = k > 0
        r.stats.record_round(k, a, a + 1)
        r.stats.draft_time_s += draft_s
        r.stats.verify_time_s += rtt
        sent, got = msg.ByteSize() + GRPC_PREFIX, resp.ByteSize() + GRPC_PREFIX
        with self._lock:
            self.wire.rounds += 1
            self.wire.request_bytes += sent
            self.wire.response_bytes += got
            self.wire.max_round_bytes = max(self.wire.max_round_bytes, sent + got)
            self.stats.record_round(k, a, a + 1)
            self.stats.draft_time_s += draft_s
            self.stats.verify_time_s += rtt
            if r.controller is not None and k:
                r.controller.record(k, a)  # under the lock: it feeds the shared acceptance pool
        self._take(r, resp)
        if k and self.drafter is not None and not r.finished:
            self._draft_pool.submit(_quiet, self.drafter.observe, r.seq_id, tuple(r.history), k, a)

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
            raise RemoteError(grpc.StatusCode.UNAVAILABLE if code == grpc.StatusCode.OK else code, "the session ended early")
        return resp

    def _choose_k(self, r: _Req) -> int:
        if self.drafter is None or not self.speculation_enabled or r.drafter_failed:
            return 0
        remaining = r.params.max_new_tokens - len(r.output)
        k = self.k if r.controller is None else r.controller.choose_k(self.cost, 0)
        return max(0, min(k or 0, remaining - 1, self.k_max))

    async def _draft(self, r: _Req, k: int) -> tuple[Draft, float]:
        """The drafter's proposal, or none (and plain decoding from now on) if it fails."""
        assert self.drafter is not None
        req = DraftRequest(r.seq_id, tuple(r.history), k, r.params)
        t0 = time.perf_counter()
        try:
            fut = asyncio.wrap_future(self._draft_pool.submit(self.drafter.propose, [req]))
            (d,) = await asyncio.wait_for(fut, self.draft_timeout_s)
            check_draft(d, k, self._vocab())
        except Exception as e:
            log.warning("drafter %s failed on request %d (%s: %s); plain decoding from here", self.drafter.name, r.seq_id, type(e).__name__, e)
            r.drafter_failed = True
            return _NO_DRAFT, time.perf_counter() - t0
        return d, time.perf_counter() - t0

    def _vocab(self) -> int:
        known = [w.info.vocab_size for w in self.pool.workers if w.info is not None]
        return min(known) if known else self.tokenizer.vocab_size

    def _take(self, r: _Req, resp: pb.SessionResponse) -> None:
        toks = list(resp.tokens)
        r.output.extend(toks)
        r.history.extend(toks)
        if resp.finish_reason:
            self._finish(r, resp.finish_reason, toks)
        else:
            _deliver(r, Chunk(toks, r.detok.delta(self.tokenizer.decode, toks, final=False), prompt_tokens=len(r.prompt)))

    def _finish(self, r: _Req, reason: str, tokens: list[int] | None = None, error: str | None = None) -> None:
        """Every path that ends a request comes here once (loop thread): counters, the last chunk."""
        if r.finished:
            return
        r.finished = True
        with self._lock:
            if r.opened:
                self._running -= 1
            else:
                self._waiting -= 1
        toks = tokens or []
        text = r.detok.delta(self.tokenizer.decode, toks, final=True) if reason != "error" else ""
        _deliver(r, Chunk(toks, text, reason, error=error, stats=r.stats, prompt_tokens=len(r.prompt)))


def _deliver(r: _Req, c: Chunk) -> None:
    """Hand a chunk to the caller's sink; a broken sink cannot break the request's bookkeeping."""
    try:
        r.sink(c)
    except Exception as e:
        log.warning("request %d: the sink failed: %s: %s", r.seq_id, type(e).__name__, e)


async def _write_read(call: grpc.aio.StreamStreamCall, msg: pb.SessionRequest) -> pb.SessionResponse:
    await call.write(msg)
    return await call.read()


def _quiet(fn: Callable[..., object], *args: object) -> None:
    """Drafter bookkeeping off the hot path: a failure there must not end anyone's request."""
    try:
        fn(*args)
    except Exception as e:
        log.warning("drafter bookkeeping failed: %s: %s", type(e).__name__, e)
