"""The engine: the one request loop, continuous batching over one round target and one drafter.

A background thread (started by the first ``submit``) runs the loop: admit a waiting request
(the target prefills it), run one speculative step over the running ones that are ready
(``engine.step``: draft here, verify on the target), hand emitted tokens to each request's sink,
end finished ones. The target is where the model runs (``engine.target.RoundTarget``): our
runner in this process (``LocalTarget``, the default), a gRPC worker session, a server that
only scores, or vLLM's token route; everything else about a request (admission, K choice,
stats, emission, stop rules, cancellation, cleanup) lives here once. Every path that ends a
request goes through ``_finish``.

The same loop serves a target worker's sessions (``engine.session_host``): a session request
is *paced* (it takes a round only when its client sent one) and its drafts come from the client.
Work that must run on the loop thread (a worker's stateless Score call) is queued with
``call_soon``.
"""

from __future__ import annotations

import concurrent.futures as cf
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from draftgate.drafters.base import Drafter
from draftgate.engine.backend import Backend, Chunk, Completion, Sink
from draftgate.engine.costs import CostModel
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.policy import SpeculationPolicy
from draftgate.engine.round import Round
from draftgate.engine.sequence import IncrementalText, PositionRandom, SequenceState, StopChecker
from draftgate.engine.step import speculative_step
from draftgate.engine.target import NotNow, RoundTarget
from draftgate.errors import CapacityError
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Engine", "EngineStopped", "Chunk", "Completion", "Sink", "Submitted"]

T = TypeVar("T")


class EngineStopped(RuntimeError):
    """The engine shut down before it ran the call."""


class Submitted:
    """What ``submit`` returns: call it to cancel the request; ``seq_id`` names it."""

    def __init__(self, seq_id: int, cancel: Callable[[], None]) -> None:
        self.seq_id = seq_id
        self._cancel = cancel

    def __call__(self) -> None:
        self._cancel()


@dataclass(eq=False)
class _Req:
    seq: SequenceState
    sink: Sink
    speculate: bool
    k_max: int  # the most drafts a round of it may carry (its KV reserve)
    detok: IncrementalText | None  # None: the sink takes tokens only (a worker's session)
    ready: Callable[[], bool] | None = None  # None: every turn; else a paced request's "it has a round"
    cancelled: bool = False


class Engine(Backend):
    def __init__(
        self,
        target: RoundTarget | ModelRunner,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_batch: int = 16,
        max_queue: int = 256,
    ) -> None:
        self.target: RoundTarget = LocalTarget(target) if isinstance(target, ModelRunner) else target
        # Our runner when the target is local (tests and the embedded route look at its KV), else None.
        self.runner: ModelRunner | None = self.target.runner if isinstance(self.target, LocalTarget) else None
        self.tokenizer = self.target.tokenizer
        self.drafter = drafter
        reader = drafter.abilities.features if drafter is not None else None
        if reader is not None:
            if not isinstance(self.target, LocalTarget):
                raise ValueError(
                    f"drafter {drafter.name!r} reads the target's hidden states, which only the embedded target "
                    "gives; on this route use another drafter (auto without a draft head, ngram, suffix, model)"
                )
            self.target.set_feature_tap(reader)
        self.policy = SpeculationPolicy(drafter, k, k_max, pricer=self.target.info.pricer)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.stats = SpecStats(drafter=drafter.name if drafter else "none")
        self._inbox: queue.SimpleQueue[_Req] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], cf.Future[Any]]] = queue.SimpleQueue()
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.approximate_requests = 0  # requests verified by an approximation (a route that allows it)

    # ----------------------------------------------------------------- public API

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        sink: Sink,
        speculate: bool = True,
        *,
        k_max: int | None = None,
        text: bool = True,
        ready: Callable[[], bool] | None = None,
    ) -> Submitted:
        """Queue a request and start the loop if needed; call the result to cancel.

        ``speculate=False`` decodes it plainly (K = 0) whatever the switch says. ``k_max``: the most
        drafts a round of it carries (default: the engine's). ``text=False``: chunks carry tokens
        only. ``ready``: a paced request takes a round only when this says so (a worker's session).
        Raises BadRequestError (can never run here) or CapacityError (the queue is full).
        """
        params.validate()
        k_max = self.k_max if k_max is None else k_max
        self.target.check(prompt_ids, params, k_max)
        if params.seed is None:  # one seed per request: the target's uniforms and the drafter's share it
            params = replace(params, seed=int(torch.randint(0, 2**62, (1,))))
        if self._inbox.qsize() + len(self._waiting) >= self.max_queue:
            raise CapacityError("the engine's queue is full; retry later")
        gen = torch.Generator()
        gen.manual_seed(params.seed)
        stop = StopChecker(self.tokenizer, params)
        seq = SequenceState(prompt=list(prompt_ids), params=params, rand=PositionRandom(gen), stop=stop)
        seq.stats.drafter = self.stats.drafter
        req = _Req(seq, sink, speculate, k_max, IncrementalText(stop) if text else None, ready)
        self._inbox.put(req)
        self._start()

        def cancel() -> None:
            req.cancelled = True
            self._wake.set()

        return Submitted(seq.seq_id, cancel)

    def call_soon(self, fn: Callable[[], T]) -> cf.Future[T]:
        """Run ``fn`` on the loop thread (which owns the target) between two turns."""
        fut: cf.Future[T] = cf.Future()
        self._calls.put((fn, fut))
        self._start()
        return fut

    def wake(self) -> None:
        """A paced request became ready."""
        self._wake.set()

    def forget_finished(self) -> None:
        """The drafter drops its memory of finished requests (the suffix trie keeps their outputs):
        a benchmark's next run starts from the same drafter memory, not from the last run's answers."""
        forget = self.drafter.abilities.forget if self.drafter is not None else None
        if forget is not None:
            forget()

    def shutdown(self) -> None:
        """Stop the loop; requests still in flight end with an 'abort' chunk (nobody waits forever)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self._abort_all()  # also covers requests submitted to an engine whose loop never started
        self.target.shutdown()

    @property
    def k(self) -> int | None:
        """Fixed K (None: the goodput controller chooses)."""
        return self.policy.k

    @property
    def k_max(self) -> int:
        return self.policy.k_max

    @property
    def cost(self) -> CostModel:
        """The measured forward and draft costs K is chosen from."""
        return self.policy.cost

    @property
    def speculation_enabled(self) -> bool:  # type: ignore[override]
        """The runtime switch: False decodes every request plainly (K = 0)."""
        return self.policy.enabled

    @speculation_enabled.setter
    def speculation_enabled(self, on: bool) -> None:
        self.policy.enabled = on and self.drafter is not None

    def kv_stats(self) -> dict[str, int]:
        return self.target.kv_stats()

    @property
    def max_context(self) -> int | None:  # type: ignore[override]
        """Prompt + completion tokens the target accepts (None: unknown)."""
        return self.target.info.max_context

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + self._inbox.qsize()

    # ---------------------------------------------------------------- the loop

    def _start(self) -> None:
        """The loop thread, started once (again after a shutdown, for requests submitted since)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop = False
                self._thread = threading.Thread(target=self._loop, name="draftgate-engine", daemon=True)
                self._thread.start()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop:
            try:
                self._turn()
            except Exception as e:  # never leave callers hanging on a dead loop
                for r in list(self._running) + list(self._waiting):
                    self._finish(r, "error", error=f"engine failure: {type(e).__name__}: {e}")
        self._abort_all()

    def _abort_all(self) -> None:
        """Shut down: end every request still here, so no caller waits forever and no KV stays held."""
        self._drain_inbox()
        for r in list(self._running) + list(self._waiting):
            self._finish(r, "abort")
        while True:
            try:
                _, fut = self._calls.get_nowait()
            except queue.Empty:
                break
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineStopped("the engine shut down"))

    def _turn(self) -> None:
        self._drain_inbox()
        self._reap_cancelled()
        busy = self._call_one()
        self._admit_one()
        batch = [r for r in self._running if r.ready is None or r.ready()]
        if batch:
            self._step(batch)
        elif not busy:
            self._wake.wait(timeout=0.5)
            self._wake.clear()

    def _drain_inbox(self) -> None:
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _reap_cancelled(self) -> None:
        for r in [r for r in (*self._waiting, *self._running) if r.cancelled]:
            self._finish(r, "abort")

    def _call_one(self) -> bool:
        try:
            fn, fut = self._calls.get_nowait()
        except queue.Empty:
            return False
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)
        return True

    def _admit_one(self) -> None:
        """Open one waiting request on the target (one per loop turn keeps running requests flowing)."""
        if not self._waiting or len(self._running) >= self.max_batch:
            return
        r = self._waiting[0]
        rnd = Round(r.seq, r.k_max)
        try:
            self.target.open(rnd)
        except NotNow:
            return  # waits, first in line, until running requests free the target's capacity
        self._waiting.popleft()
        self._running.append(r)
        self.policy.open(r.seq.seq_id, r.seq.params, r.speculate)
        if rnd.error is not None:  # a failed prefill fails this request only
            self._finish(r, "error", error=rnd.error)
            return
        r.seq.stats.target_decoded |= rnd.target_decoded
        if rnd.approximate:
            r.seq.stats.approximate = True
            self.approximate_requests += 1
        self._emit(r, r.seq.append(rnd.emitted), 0)

    def _step(self, batch: list[_Req]) -> None:
        rounds = [Round(r.seq, r.k_max) for r in batch]
        try:
            speculative_step(self.target, self.drafter, self.policy, rounds)
        except Exception as e:
            for r in batch:  # the target failed: a clear error to each request, KV freed
                self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            return
        with self._lock:
            self.stats.draft_time_s += rounds[0].draft_s
            self.stats.verify_time_s += rounds[0].forward_s
            for rnd in rounds:
                if rnd.error is None:  # else the request ends with the target's error
                    _record(rnd.seq.stats, rnd)
                    self.stats.record_round(rnd.drafted, rnd.accepted, len(rnd.kept))
        for r, rnd in zip(batch, rounds, strict=True):  # emit, or end with the target's error
            if rnd.error is not None:
                self._finish(r, "error", error=rnd.error)
            else:
                self._emit(r, rnd.kept, rnd.accepted)

    def _emit(self, r: _Req, tokens: list[int], accepted: int) -> None:
        s = r.seq
        if s.finish_reason is not None:
            self._finish(r, s.finish_reason, tokens, accepted=accepted)
            return
        text = r.detok.delta(self.tokenizer.decode, tokens, final=False) if r.detok is not None else ""
        self._deliver(r, Chunk(tokens, text, prompt_tokens=len(s.prompt), accepted=accepted))

    def _finish(
        self, r: _Req, reason: str, tokens: list[int] | None = None, error: str | None = None, accepted: int = 0
    ) -> None:
        """Every path that ends a request comes here: KV freed, speculation and drafter state dropped, sink told."""
        self.target.close(r.seq.seq_id)  # before leaving _running: num_running == 0 implies KV is back
        if r in self._running:
            self._running.remove(r)
        if r in self._waiting:
            self._waiting.remove(r)
        self.policy.close(r.seq.seq_id)
        if self.drafter is not None:
            try:
                self.drafter.release(r.seq.seq_id)
            except Exception:
                pass  # the request is over either way; its sink must still hear so
        toks = tokens or []
        text = (
            r.detok.delta(self.tokenizer.decode, toks, final=True) if r.detok is not None and reason != "error" else ""
        )
        chunk = Chunk(
            toks, text, reason, error=error, stats=r.seq.stats, prompt_tokens=len(r.seq.prompt), accepted=accepted
        )
        self._deliver(r, chunk)

    def _deliver(self, r: _Req, chunk: Chunk) -> None:
        """Hand a chunk to the request's sink. A sink that raises (e.g. the client's event loop is
        closed) means nobody is listening: the request is cancelled, the loop and others go on."""
        try:
            r.sink(chunk)
        except Exception:
            r.cancelled = True


def _record(st: SpecStats, rnd: Round) -> None:
    """One sequence's round in its request's stats (emitted: what it kept after stop cuts)."""
    st.record_round(rnd.drafted, rnd.accepted, len(rnd.kept))
    st.approximate |= rnd.approximate
    st.target_decoded |= rnd.target_decoded
    st.fallback_rounds += rnd.fallback
    st.sampled_rounds += rnd.sampled
    st.draft_time_s += rnd.draft_s  # each request waits the whole step
    st.verify_time_s += rnd.forward_s
