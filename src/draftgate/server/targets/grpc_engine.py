"""RemoteTargetEngine: the engine with its target on gRPC workers (`draftgate serve-target`).

Not a loop of its own: ``Engine`` runs every request (admission, K choice, drafting, stats,
emission, stop rules, cleanup) and ``GrpcTarget`` speaks to the workers (sessions, rounds,
failover). This class only wires the two, puts a deadline on the drafter (a remote draft tier
that is slow costs its round's drafts, nothing else) and exposes the wire statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgate.drafters.base import Drafter
from draftgate.drafters.time_limit import TimeLimitedDrafter
from draftgate.engine.engine import Engine
from draftgate.models.tokenizer import TextTokenizer
from draftgate.server.proto.wire import WireStats
from draftgate.server.targets.grpc_pool import WorkerPool
from draftgate.server.targets.grpc_target import GrpcTarget, RemoteError

__all__ = ["RemoteTargetEngine", "RemoteError"]


class RemoteTargetEngine(Engine):
    def __init__(
        self,
        targets: Sequence[str],
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_batch: int = 64,
        max_queue: int = 256,
        draft_timeout_s: float | None = None,
        rpc_timeout_s: float = 60.0,
        retry_s: float = 1.0,
        health_interval_s: float = 5.0,
    ) -> None:
        if k is not None and not 0 <= k <= k_max:
            raise ValueError(f"k must be in [0, k_max={k_max}] or None (adaptive), got {k}")
        target = GrpcTarget(
            targets, tokenizer, rpc_timeout_s=rpc_timeout_s, retry_s=retry_s, health_interval_s=health_interval_s
        )
        if drafter is not None and draft_timeout_s is not None:
            drafter = TimeLimitedDrafter(drafter, draft_timeout_s)
        super().__init__(target, drafter, k=k, k_max=k_max, max_batch=max_batch, max_queue=max_queue)
        self.grpc = target

    @property
    def wire(self) -> WireStats:
        return self.grpc.wire

    @property
    def pool(self) -> WorkerPool:
        return self.grpc.pool
