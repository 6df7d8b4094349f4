"""Remote drafts for the vLLM proposer: a deadline per round, and the next round asked for early.

A draft from another machine costs a network round trip per round, paid while vLLM waits.
Two rules keep it from costing more than it saves:

* **A late draft is no draft.** Each round waits at most ``timeout_s`` for the worker; a
  request whose answer is late (or failed) gets no draft this round and decodes plainly.
* **Prefetch.** As soon as a request's draft is handed to vLLM, the worker is asked, in the
  background, for the ``1 + k_max`` tokens that follow the history *with that draft accepted*
  (the likeliest outcome on text worth drafting). If vLLM accepts the whole draft and its
  bonus token is the worker's first guess, the rest is the next round's draft with no round
  trip in the way; otherwise the round asks the worker as usual.

Calls for one request are serialized (the worker keeps one session per request); calls for
different requests run in parallel on a small thread pool. Drafts are token ids only: vLLM
verifies them as one-hot drafts, which is exact whatever the worker drafted.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from draftgate.drafters.base import Abilities, Draft, Drafter, DraftRequest

__all__ = ["RemoteCounters", "PrefetchingDrafter"]

log = logging.getLogger("draftgate.integrations.vllm")


@dataclass
class RemoteCounters:
    """What the remote tier did, per round asked (read by the stats sinks)."""

    prefetch_hits: int = 0  # rounds drafted from a prefetched guess: no round trip waited on
    calls: int = 0  # rounds that asked the worker and waited
    late: int = 0  # ... whose answer missed the deadline (no draft)
    failures: int = 0  # ... whose call failed (worker down, bad answer): no draft
    wait_s: float = 0.0  # seconds rounds spent waiting on the worker


@dataclass
class _Ahead:
    start: int  # history length when the draft was handed out
    draft: tuple[int, ...]  # the draft assumed accepted
    future: cf.Future[list[int]]  # the worker's next tokens after history + draft

    @property
    def base(self) -> int:
        return self.start + len(self.draft)


class PrefetchingDrafter:
    """Any per-request drafter (a `draftgate serve-draft` client) under a deadline, with prefetch."""

    name = "remote"
    sampled_q = False
    abilities = Abilities()  # none beyond the protocol

    def __init__(self, inner: Drafter, timeout_s: float, k_max: int, prefetch: bool = True, workers: int = 4) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.inner, self.timeout_s, self.k_max, self.prefetch = inner, timeout_s, k_max, prefetch
        self.counters = RemoteCounters()
        self._pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="draftgate-remote")
        self._locks: dict[int, threading.Lock] = {}
        self._ahead: dict[int, _Ahead] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        deadline = time.monotonic() + self.timeout_s
        drafts: list[list[int] | None] = [self._from_ahead(r, deadline) for r in requests]
        waiting = {
            i: self._call(r, list(map(int, r.tokens)), r.k)
            for i, r in enumerate(requests)
            if drafts[i] is None and r.k > 0
        }
        for i, fut in waiting.items():
            drafts[i] = self._wait(fut, deadline, count=True)
        out = []
        for r, d in zip(requests, drafts, strict=True):
            toks = (d or [])[: r.k]
            if self.prefetch and r.k > 0:
                self._prefetch(r, toks)
            out.append(Draft(toks))
        return out

    def _from_ahead(self, r: DraftRequest, deadline: float) -> list[int] | None:
        """The draft a prefetched guess gives this round, or None (no guess, or the history left it)."""
        a = self._ahead.pop(r.seq_id, None)
        n = len(r.tokens)
        if a is None or r.k <= 0 or n <= a.base or tuple(r.tokens[a.start : a.base]) != a.draft:
            return None  # not every draft was accepted: the guess continues a history that did not happen
        guess = self._wait(a.future, deadline, count=False)
        if guess is None or len(guess) <= n - a.base or list(r.tokens[a.base : n]) != guess[: n - a.base]:
            return None
        self.counters.prefetch_hits += 1
        return guess[n - a.base :]

    def _prefetch(self, r: DraftRequest, draft: list[int]) -> None:
        base = list(map(int, r.tokens)) + draft
        self._ahead[r.seq_id] = _Ahead(len(r.tokens), tuple(draft), self._call(r, base, 1 + self.k_max))

    def _call(self, r: DraftRequest, tokens: list[int], k: int) -> cf.Future[list[int]]:
        """Ask the worker for k tokens after ``tokens`` (r's own history, or it with a draft accepted)."""
        lock = self._locks.setdefault(r.seq_id, threading.Lock())
        ask = DraftRequest(r.seq_id, tokens, k, r.params)

        def run() -> list[int]:
            with lock:
                (d,) = self.inner.propose([ask])
                return list(d.token_ids)

        return self._pool.submit(run)

    def _wait(self, fut: cf.Future[list[int]], deadline: float, count: bool) -> list[int] | None:
        t0 = time.monotonic()
        try:
            return fut.result(timeout=max(0.0, deadline - t0))
        except cf.TimeoutError:
            if count:
                self.counters.late += 1
            return None
        except Exception as e:  # the worker is down or answered badly: this round has no draft
            if count:
                self.counters.failures += 1
                if self.counters.failures == 1:
                    log.warning(
                        "remote draft worker failed (%s: %s); rounds go on without its drafts", type(e).__name__, e
                    )
            return None
        finally:
            if count:
                self.counters.calls += 1
            self.counters.wait_s += time.monotonic() - t0

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass  # the next call sends the new tokens

    def release(self, seq_id: int) -> None:
        self._ahead.pop(seq_id, None)
        lock = self._locks.pop(seq_id, threading.Lock())

        def run() -> None:
            with lock:
                self.inner.release(seq_id)

        try:
            self._pool.submit(run)
        except RuntimeError:
            pass  # shut down

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
