"""`draftgate serve-target`: the gRPC edge of a SessionHost (validate, call, answer; nothing else).

Status codes: INVALID_ARGUMENT for bad input (the session is over), FAILED_PRECONDITION
for a round on a finished or closed session, UNAVAILABLE when the worker is
shutting down, INTERNAL when the target itself failed. Every way out of a
Session call (finish, client close or cancel, error) closes the session, which
frees its KV.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import grpc

from draftgate.engine import Chunk
from draftgate.engine.session_host import SessionGone, SessionHost, WorkerShuttingDown
from draftgate.errors import BadRequestError
from draftgate.server.proto import target_pb2 as pb
from draftgate.server.proto import target_pb2_grpc as pb_grpc
from draftgate.server.proto.wire import params_from_pb, q_rows_from_pb

__all__ = ["TargetServicer", "TargetWorkerServer"]

log = logging.getLogger("draftgate.target")


def _response(c: Chunk) -> pb.SessionResponse:
    return pb.SessionResponse(tokens=c.token_ids, num_accepted=c.accepted, finish_reason=c.finish_reason or "")


class TargetServicer(pb_grpc.TargetWorkerServicer):
    def __init__(self, host: SessionHost) -> None:
        self.host = host

    async def Session(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext
    ) -> None:
        # Answers go through context.write (not a generator): a server stopping mid-session
        # then cancels this coroutine cleanly.
        sid: int | None = None
        try:
            async for req in request_iterator:
                kind = req.WhichOneof("kind")
                if kind == "open" and sid is None:
                    o = req.open
                    sid, fut = self.host.open(o.prompt, params_from_pb(o.params), o.max_draft_tokens)
                elif kind == "round" and sid is not None:
                    fut = self.host.round(sid, req.round.draft, q_rows_from_pb(req.round))
                else:
                    raise BadRequestError("a session is one Open followed by Rounds")
                await context.write(_response(await asyncio.wrap_future(fut)))
        except (BadRequestError, ValueError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except WorkerShuttingDown as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except SessionGone as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Exception as e:  # the target failed (a model error): the client gets a clear status
            log.exception("session failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"target failure: {type(e).__name__}: {e}")
        finally:
            if sid is not None:
                try:
                    self.host.close(sid)
                except SessionGone:
                    pass  # shutting down: shutdown() frees every session

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:  # noqa: N802
        try:
            fut = self.host.score(request.tokens, request.validation_offset, request.top_n)
            rows = await asyncio.wrap_future(fut)
        except (BadRequestError, ValueError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except WorkerShuttingDown as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        out = pb.ScoreResponse()
        for r in rows:
            out.positions.add(
                position=r.position,
                has_token=r.token is not None,
                token=r.token or 0,
                logprob=r.logprob or 0.0,
                top_ids=r.top_ids,
                top_logprobs=r.top_logprobs,
            )
        return out

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:  # noqa: N802
        return pb.HealthResponse(**self.host.health())  # type: ignore[arg-type]


class TargetWorkerServer:
    """A grpc.aio server for one SessionHost, on its own event-loop thread.

    ``start()`` returns once the port is bound (``port`` is then the real one, also
    for port 0). ``stop(grace)`` ends in-flight calls (their clients see an error)
    and then stops the host, freeing every session's KV.
    """

    def __init__(self, host: SessionHost, address: str = "127.0.0.1:0") -> None:
        self.host = host
        self.address = address
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._server: grpc.aio.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def start(self) -> TargetWorkerServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        async def boot() -> None:
            try:
                self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
                pb_grpc.add_TargetWorkerServicer_to_server(TargetServicer(self.host), self._server)
                self.port = self._server.add_insecure_port(self.address)
                if self.port == 0:
                    raise OSError(f"cannot listen on {self.address}")
                await self._server.start()
            except BaseException as e:
                failure.append(e)
            finally:
                ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(boot())
            if not failure:
                self._loop.run_forever()
            self._drain()
            self._loop.close()
            self._stopped.set()

        self._thread = threading.Thread(target=run, name="draftgate-grpc", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self.host.shutdown()
            raise failure[0]
        return self

    def _drain(self) -> None:
        """Let the tasks the stopped server left behind end before the loop closes (on its thread).

        grpc.aio wraps each call in a task that finishes an iteration after its handler; closing the
        loop at once left it pending ("Task was destroyed but it is pending" at exit, now and then).
        A task still running after a second is cancelled, as ``asyncio.run`` does.
        """
        pending = asyncio.all_tasks(self._loop)
        if pending:
            _, late = self._loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            for t in late:
                t.cancel()
            if late:
                self._loop.run_until_complete(asyncio.gather(*late, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())

    @property
    def target(self) -> str:
        """The address clients dial: host:port."""
        return f"{self.address.rsplit(':', 1)[0]}:{self.port}"

    def stop(self, grace: float | None = 0.5) -> None:
        if self._thread is None:
            return
        if self._server is not None and not self._loop.is_closed():
            fut = asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop)
            try:
                fut.result(timeout=(grace or 0) + 10)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None
        self.host.shutdown()

    def wait(self) -> None:
        """Block until the server stops (the CLI's main thread)."""
        self._stopped.wait()
