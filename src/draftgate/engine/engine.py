"""The engine: the one request loop, continuous batching over one round target and one drafter.

A background thread runs the loop: admit a waiting request (the target prefills it), run one
speculative step over all running ones (draft here, verify on the target), hand emitted tokens
to each request's sink, end finished ones. The target is where the model runs
(``engine.target.RoundTarget``): our runner in this process (``LocalTarget``, the default),
a gRPC worker session, or an OpenAI-compatible server; everything else about a request
(admission, K choice, stats, emission, stop rules, cancellation, cleanup) lives here once.
Callers talk to it through ``submit`` (thread-safe), ``generate`` (async iterator) or
``complete`` (blocking).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from draftgate.drafters.base import Draft, Drafter
from draftgate.engine.costs import CostModel
from draftgate.engine.frontend import Chunk, Completion, Frontend, Sink
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.policy import SpecState, SpeculationPolicy
from draftgate.engine.sequence import IncrementalText, PositionRandom, SequenceState, StopChecker
from draftgate.engine.step import SeqRound, StepResult, round_work, speculative_step
from draftgate.engine.target import NotNow, RoundTarget
from draftgate.errors import CapacityError
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Engine", "Chunk", "Completion", "Sink"]


@dataclass
class _Req:
    seq: SequenceState
    sink: Sink
    spec: SpecState  # K and source choice across its rounds (engine.policy)
    detok: IncrementalText
    cancelled: bool = False


class Engine(Frontend):
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
        self.policy = SpeculationPolicy(drafter, k, k_max)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.stats = SpecStats(drafter=drafter.name if drafter else "none")
        self._inbox: queue.SimpleQueue[_Req] = queue.SimpleQueue()
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.approximate_requests = 0  # requests verified by an approximation (a route that allows it)

    # ----------------------------------------------------------------- public API

    def start(self) -> Engine:
        if self._thread is None or not self._thread.is_alive():
            self._stop = False  # a shut-down engine restarts for requests submitted since
            self._thread = threading.Thread(target=self._loop, name="draftgate-engine", daemon=True)
            self._thread.start()
        return self

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

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True
    ) -> Callable[[], None]:
        """Queue a request; returns a cancel function. Raises BadRequestError / CapacityError.

        ``speculate=False`` decodes this request plainly (K = 0) whatever the engine's switch says.
        """
        params.validate()
        self.target.check(prompt_ids, params, self.k_max)  # BadRequestError: can never run here
        if params.seed is None:  # one seed per request: the target's uniforms and the drafter's share it
            params = replace(params, seed=int(torch.randint(0, 2**62, (1,))))
        if self._inbox.qsize() + len(self._waiting) >= self.max_queue:
            raise CapacityError("the engine's queue is full; retry later")
        gen = torch.Generator()
        gen.manual_seed(params.seed)
        seq = SequenceState(
            prompt=list(prompt_ids), params=params, rand=PositionRandom(gen), stop=StopChecker(self.tokenizer, params)
        )
        seq.stats.drafter = self.stats.drafter
        req = _Req(seq, sink, self.policy.open(params, speculate), IncrementalText(seq.stop))
        self._inbox.put(req)
        self._wake.set()

        def cancel() -> None:
            req.cancelled = True
            self._wake.set()

        return cancel

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
    def speculation_enabled(self) -> bool:
        """The runtime switch: False decodes every request plainly (K = 0)."""
        return self.policy.enabled

    @speculation_enabled.setter
    def speculation_enabled(self, on: bool) -> None:
        self.policy.enabled = on and self.drafter is not None

    def kv_stats(self) -> dict[str, int]:
        return self.target.kv_stats()

    @property
    def max_context(self) -> int | None:
        """Prompt + completion tokens the target accepts (None: unknown)."""
        return self.target.info.max_context

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + self._inbox.qsize()

    # ---------------------------------------------------------------- the loop

    def _loop(self) -> None:
        while not self._stop:
            try:
                self._turn()
            except Exception as e:  # never leave callers hanging on a dead loop
                for r in list(self._running) + list(self._waiting):
                    self._finish(r, "error", error=f"engine failure: {type(e).__name__}: {e}")
                self._waiting.clear()
        self._abort_all()

    def _abort_all(self) -> None:
        """Shut down: end every request still here, so no caller waits forever and no KV stays held."""
        self._drain_inbox()
        for r in list(self._running) + list(self._waiting):
            self._finish(r, "abort")
        self._waiting.clear()

    def _turn(self) -> None:
        self._drain_inbox()
        self._reap_cancelled()
        if not self._running and not self._waiting:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            return
        self._admit_one()
        if self._running:
            self._step()

    def _drain_inbox(self) -> None:
        while True:
            try:
                self._waiting.append(self._inbox.get_nowait())
            except queue.Empty:
                return

    def _reap_cancelled(self) -> None:
        for r in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(r)
            self._deliver(r, Chunk([], "", "abort", stats=r.seq.stats))
        for r in [r for r in self._running if r.cancelled]:
            self._finish(r, "abort")

    def _admit_one(self) -> None:
        """Open one waiting request on the target (one per loop turn keeps running requests flowing)."""
        if not self._waiting or len(self._running) >= self.max_batch:
            return
        r = self._waiting[0]
        try:
            done = self.target.open(round_work(r.seq, Draft([])), self.k_max)
        except NotNow:
            return  # waits, first in line, until running requests free the target's capacity
        self._waiting.popleft()
        if done.error is not None:  # a failed prefill fails this request only
            self.target.close(r.seq.seq_id)
            self._release_draft(r)
            self._deliver(r, Chunk([], "", "error", error=done.error, stats=r.seq.stats))
            return
        r.seq.stats.target_decoded |= done.target_decoded
        if done.approximate:
            r.seq.stats.approximate = True
            self.approximate_requests += 1
        self._running.append(r)
        self._emit(r, r.seq.append(done.emitted))

    def _step(self) -> None:
        batch, seqs = list(self._running), [r.seq for r in self._running]
        plans = self.policy.plan([r.spec for r in batch], seqs)  # 1. plan: K and source per sequence
        try:  # 2. run: draft, verify on the target, append what each sequence keeps
            res = speculative_step(self.target, self.drafter, seqs, [p.k for p in plans], [p.hidden for p in plans])
        except Exception as e:
            for r in batch:  # the target failed: a clear error to each request, KV freed
                self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            return
        self.policy.update([r.spec for r in batch], seqs, plans, res)  # 3. update: prices, acceptance
        with self._lock:
            for r, rnd in zip(batch, res.rounds, strict=True):
                self._record(r.seq.stats, rnd, res)
            self.stats.draft_time_s += res.draft_s
            self.stats.verify_time_s += res.forward_s
        for r, rnd in zip(batch, res.rounds, strict=True):  # 4. emit, or end with the target's error
            if rnd.error is not None:
                self._finish(r, "error", error=rnd.error)
            else:
                self._emit(r, rnd.emitted)

    def _record(self, st: SpecStats, rnd: SeqRound, res: StepResult) -> None:
        """One sequence's round in its stats and the engine's (emitted = what it kept after stop cuts)."""
        if rnd.error is not None:
            return  # the request ends with the target's error
        st.record_round(rnd.drafted, rnd.accepted, len(rnd.emitted))
        st.approximate |= rnd.approximate
        st.target_decoded |= rnd.target_decoded
        st.fallback_rounds += rnd.fallback
        st.sampled_rounds += rnd.sampled
        st.draft_time_s += res.draft_s  # each request waits the whole round
        st.verify_time_s += res.forward_s
        self.stats.record_round(rnd.drafted, rnd.accepted, len(rnd.emitted))

    def _emit(self, r: _Req, tokens: list[int]) -> None:
        s = r.seq
        if s.finish_reason is not None:
            self._finish(r, s.finish_reason, tokens)
            return
        text = r.detok.delta(self.tokenizer.decode, tokens, final=False)
        self._deliver(r, Chunk(tokens, text, prompt_tokens=len(s.prompt)))

    def _finish(self, r: _Req, reason: str, tokens: list[int] | None = None, error: str | None = None) -> None:
        """Every path that ends a request comes here: KV freed, drafter state dropped, sink told."""
        self.target.close(r.seq.seq_id)  # before leaving _running: num_running == 0 implies KV is back
        if r in self._running:
            self._running.remove(r)
        self._release_draft(r)
        toks = tokens or []
        text = r.detok.delta(self.tokenizer.decode, toks, final=True) if reason != "error" else ""
        self._deliver(r, Chunk(toks, text, reason, error=error, stats=r.seq.stats, prompt_tokens=len(r.seq.prompt)))

    def _release_draft(self, r: _Req) -> None:
        if self.drafter is not None:
            try:
                self.drafter.release(r.seq.seq_id)
            except Exception:
                pass  # the request is over either way; its sink must still hear so

    def _deliver(self, r: _Req, chunk: Chunk) -> None:
        """Hand a chunk to the request's sink. A sink that raises (e.g. the client's event loop is
        closed) means nobody is listening: the request is cancelled, the loop and others go on."""
        try:
            r.sink(chunk)
        except Exception:
            r.cancelled = True
