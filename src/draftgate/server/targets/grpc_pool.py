"""Target workers as the client sees them: channels, load, health, and back-off after failures.

New sessions go to the least-loaded healthy worker (fewest sessions this client
has open there, then fewest the worker reported in its last Health answer, then
fewest picks so far, which spreads sequential sessions round-robin). A worker
that fails is marked down until its back-off expires (doubling per consecutive
failure, capped); then a Health call decides whether it takes sessions again.
Everything here runs on the client's event loop (grpc.aio objects are bound to it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import grpc

from draftgate.server.proto import target_pb2 as pb
from draftgate.server.proto import target_pb2_grpc as pb_grpc

__all__ = ["NoWorkerError", "WorkerHandle", "WorkerPool", "parse_target"]


# Our own back-off decides when a down worker is tried again: a channel must not share
# gRPC's global subchannel (and its reconnect back-off) with the channel it replaces.
_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


class NoWorkerError(RuntimeError):
    """No target worker can take a session now."""


def parse_target(spec: str) -> str:
    """``grpc://host:port`` or ``host:port`` -> ``host:port``."""
    addr = spec.removeprefix("grpc://").rstrip("/")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"target worker address must be grpc://HOST:PORT, got {spec!r}")
    return addr


@dataclass(eq=False)
class WorkerHandle:
    address: str
    channel: grpc.aio.Channel | None = None
    stub: pb_grpc.TargetWorkerStub | None = None
    sessions: int = 0  # sessions this client has open on the worker
    picks: int = 0
    info: pb.HealthResponse | None = None  # the last Health answer
    down: bool = False
    down_until: float = 0.0
    failures: int = 0  # consecutive
    last_error: str = ""
    retired: list[grpc.aio.Channel] = field(default_factory=list)  # replaced channels, closed at the end


class WorkerPool:
    def __init__(
        self,
        addresses: Sequence[str],
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
        health_timeout_s: float = 2.0,
        min_vocab: int = 0,
    ) -> None:
        if not addresses:
            raise ValueError("name at least one target worker (grpc://HOST:PORT)")
        self.workers = [WorkerHandle(parse_target(a)) for a in addresses]
        self.retry_s, self.max_retry_s = retry_s, max_retry_s
        self.health_timeout_s = health_timeout_s
        self.min_vocab = min_vocab  # a worker with a smaller vocabulary serves another model

    def _connect(self, w: WorkerHandle) -> pb_grpc.TargetWorkerStub:
        if w.stub is None:
            w.channel = grpc.aio.insecure_channel(w.address, options=_CHANNEL_OPTIONS)
            w.stub = pb_grpc.TargetWorkerStub(w.channel)
        return w.stub

    async def acquire(self, exclude: Iterable[WorkerHandle] = ()) -> tuple[WorkerHandle, pb_grpc.TargetWorkerStub]:
        """Pick the least-loaded healthy worker and count a session on it (release() undoes)."""
        skip = set(exclude)
        now = time.monotonic()
        cands = [w for w in self.workers if w not in skip]
        stale = [w for w in cands if w.info is None or (w.down and now >= w.down_until)]
        if stale:
            await asyncio.gather(*(self.probe(w) for w in stale))
        up = [w for w in cands if not w.down]
        if not up:
            why = "; ".join(f"{w.address}: {w.last_error or 'down'}" for w in self.workers)
            raise NoWorkerError(f"no healthy target worker ({why})")
        w = min(up, key=lambda w: (w.sessions, w.info.open_sessions if w.info else 0, w.picks))
        w.sessions += 1
        w.picks += 1
        return w, self._connect(w)

    def release(self, w: WorkerHandle) -> None:
        w.sessions -= 1

    def mark_down(self, w: WorkerHandle, why: str) -> None:
        """Stop sending sessions to w until its back-off expires (sessions failing together count once)."""
        w.last_error = why
        if w.down and time.monotonic() < w.down_until:
            return
        w.failures += 1
        w.down = True
        w.down_until = time.monotonic() + min(self.retry_s * 2 ** (w.failures - 1), self.max_retry_s)

    def mark_ok(self, w: WorkerHandle) -> None:
        w.failures = 0

    async def probe(self, w: WorkerHandle) -> bool:
        """One Health call: up (and its info refreshed) or down with back-off."""
        if w.down and w.channel is not None:
            # A fresh channel dials at once; the old one may sit in gRPC's own reconnect
            # back-off. Sessions still on the old channel keep it until the pool closes.
            w.retired.append(w.channel)
            w.channel = w.stub = None
        try:
            info = await self._connect(w).Health(pb.HealthRequest(), timeout=self.health_timeout_s)
        except grpc.aio.AioRpcError as e:
            self.mark_down(w, f"health check failed: {e.code().name}: {e.details()}")
            return False
        if info.vocab_size < self.min_vocab:
            self.mark_down(w, f"serves a model with vocabulary {info.vocab_size} < the tokenizer's {self.min_vocab}")
            return False
        w.info, w.down, w.last_error = info, False, ""
        return True

    async def probe_all(self) -> None:
        """Refresh every worker that is up or whose back-off has expired."""
        now = time.monotonic()
        await asyncio.gather(*(self.probe(w) for w in self.workers if not w.down or now >= w.down_until))

    async def close(self) -> None:
        for w in self.workers:
            for ch in [*w.retired, *([w.channel] if w.channel is not None else [])]:
                await ch.close()
            w.channel, w.stub, w.retired = None, None, []

    @property
    def max_context(self) -> int | None:
        """The smallest context of the workers that answered (None before any did)."""
        known = [w.info.max_context for w in self.workers if w.info is not None]
        return min(known) if known else None

    def kv_stats(self) -> dict[str, int]:
        """Sum over the workers' last Health answers (for metrics gauges)."""
        out = {"num_blocks": 0, "free_blocks": 0, "used_blocks": 0, "workers_up": 0}
        for w in self.workers:
            if w.info is not None and not w.down:
                out["num_blocks"] += w.info.kv_blocks_total
                out["free_blocks"] += w.info.kv_blocks_free
                out["used_blocks"] += w.info.kv_blocks_used
                out["workers_up"] += 1
        return out
