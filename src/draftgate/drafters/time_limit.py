"""TimeLimitedDrafter: any drafter under a deadline per call (a remote draft tier must not stall rounds).

Calls run on one helper thread (drafters need not be thread-safe, and a call that overran is
still running there: later calls queue behind it). A ``propose`` that misses the deadline
raises ``TimeoutError``; the engine then decodes the requests concerned plainly, losing no
token. ``observe`` and ``release`` are queued on the same thread and never block the caller.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable, Sequence

from draftgate.drafters.base import Abilities, Draft, Drafter, DraftRequest

__all__ = ["TimeLimitedDrafter"]

log = logging.getLogger("draftgate.drafters")


class TimeLimitedDrafter:
    def __init__(self, inner: Drafter, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.inner = inner
        self.name = inner.name
        self.sampled_q = inner.sampled_q
        # Only whether it drafts lookups is forwarded: the inner drafter runs on the helper thread, and
        # reading the target's features, choosing sources or forgetting there would race with a call.
        self.abilities = Abilities(lookup=inner.abilities.lookup)
        self.timeout_s = timeout_s
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="draftgate-draft")

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        fut = self._pool.submit(self.inner.propose, list(requests))
        try:
            return fut.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            raise TimeoutError(f"drafter {self.name} took longer than {self.timeout_s:g} s") from None

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        self._later(self.inner.observe, seq_id, tuple(tokens), num_drafted, num_accepted)

    def release(self, seq_id: int) -> None:
        self._later(self.inner.release, seq_id)

    def _later(self, fn: Callable[..., object], *args: object) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception as e:  # bookkeeping off the hot path: it must not end anyone's request
                log.warning("drafter %s bookkeeping failed: %s: %s", self.name, type(e).__name__, e)

        try:
            self._pool.submit(run)
        except RuntimeError:
            pass  # shut down: nothing left to keep in sync

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
