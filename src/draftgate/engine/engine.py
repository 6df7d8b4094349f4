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

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from draftgate.drafters.base import Draft, Drafter
from draftgate.engine.controller import AcceptancePool, GoodputController
from draftgate.engine.costs import CostModel
from draftgate.engine.frontend import Chunk, Completion, Frontend, Sink
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.sequence import IncrementalText, PositionRandom, SequenceState, StopChecker
from draftgate.engine.step import round_work, speculative_step
from draftgate.engine.target import NotNow, RoundTarget
from draftgate.errors import CapacityError
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Engine", "Chunk", "Completion", "Sink"]




@dataclass
class _Req:
    seq: SequenceState
    sink: Sink
    controller: GoodputController | None  # the controller of this round's draft source
    detok: IncrementalText
    cancelled: bool = False
    started: bool = False
    drafter_failed: bool = False  # the drafter failed on this request: plain decoding from now on
    speculate: bool = True  # False: this request decodes plainly (a canary's control arm, a lossless re-run)
    # The source that drafted its previous round (None: none did), and per source the history length
    # when that source last drafted for it: a source that skipped rounds has them to catch up on
    # (a draft head absorbs the positions lookup drafted since its own last draft).
    last_source: str | None = None
    synced: dict[str, int] = field(default_factory=dict)
    seeded: bool = False  # seeded sampling with a drafter that may sample q: K from its own tokens only
    # A drafter with several sources (auto: lookups, a draft head) gets one controller per source:
    # their acceptance and cost differ by far, and one estimate for both would cut lookup's long drafts.
    controllers: dict[str, GoodputController] = field(default_factory=dict)
    source: str = ""  # this round's source (the drafter's name when it has one only)


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
        if drafter is not None and getattr(drafter, "feature_layers", ()):
            if not isinstance(self.target, LocalTarget):
                raise ValueError(
                    f"drafter {drafter.name!r} reads the target's hidden states, which only the embedded target "
                    "gives; on this route use another drafter (auto without a draft head, ngram, suffix, model)"
                )
            self.target.set_feature_tap(drafter)  # type: ignore[arg-type]
        self.k = k
        self.k_max = k_max if drafter is not None else 0
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.cost = CostModel()
        # Seeded sampling requests on a drafter that may send a sampled q (drafter.sampled_q) price
        # rounds with the cost prior, never with timings: with a sampled q, which positions are
        # drafted changes the tokens (a drafted position is verified by rejection, an undrafted one
        # sampled plainly), so a schedule that followed the clock or the batch would give a seed
        # different tokens from run to run. Never observed, so fixed.
        self._prior_cost = CostModel()
        self.acceptance = AcceptancePool(self.k_max)  # new requests start from it
        self._pools: dict[str, AcceptancePool] = {drafter.name: self.acceptance} if drafter else {}  # per source
        self.stats = SpecStats(drafter=drafter.name if drafter else "none")
        self._inbox: queue.SimpleQueue[_Req] = queue.SimpleQueue()
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.speculation_enabled = drafter is not None
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
        forget = getattr(self.drafter, "forget", None)
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
        seeded = params.seed is not None and not params.greedy and self.drafter is not None and self.drafter.sampled_q
        ctl = None
        if self.drafter is not None and self.k is None and self.k_max > 0:
            ctl = GoodputController(self.k_max, self.drafter.name, pool=None if seeded else self.acceptance)
        req = _Req(seq, sink, ctl, IncrementalText(seq.stop), speculate=speculate, seeded=seeded)
        if ctl is not None:
            req.controllers[ctl.drafter] = ctl
            req.source = ctl.drafter
        self._inbox.put(req)
        self._wake.set()

        def cancel() -> None:
            req.cancelled = True
            self._wake.set()

        return cancel

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
        if done.approximate:
            r.seq.stats.approximate = True
            self.approximate_requests += 1
        self._running.append(r)
        self._emit(r, r.seq.append(done.emitted))

    def _choose_k(self, r: _Req, other_tokens: int) -> int:
        if self.drafter is None or not self.speculation_enabled or r.drafter_failed or not r.speculate:
            return 0
        remaining = r.seq.params.max_new_tokens - len(r.seq.output)
        if r.controller is not None:
            self._pick_source(r)
        catch_up = self._lag(r)
        if r.controller is None:
            k = self.k
        elif r.seeded:  # the request's own acceptance and the cost prior: the same seed, the same schedule
            k = r.controller.choose_k(self._prior_cost, 0, catch_up, remaining)
        else:
            k = r.controller.choose_k(self.cost, other_tokens, catch_up, remaining)
        return max(0, min(k or 0, remaining - 1, self.k_max))

    @staticmethod
    def _lag(r: _Req) -> int:
        """Tokens this round's source has not drafted over (0 if it drafted the previous round)."""
        return 0 if r.last_source == r.source else len(r.seq.history) - r.synced.get(r.source, 0)

    def _pick_source(self, r: _Req) -> None:
        """The controller of the source the drafter will draft this request's next round from."""
        source_of = getattr(self.drafter, "source", None)
        if source_of is None:
            return
        try:
            src = str(source_of(r.seq.seq_id, r.seq.history, self.k_max))
        except Exception:  # a drafter failure costs this request its drafts, nothing more
            logging.getLogger(__name__).exception("drafter source failed for sequence %d", r.seq.seq_id)
            r.drafter_failed = True
            return
        ctl = r.controllers.get(src)
        if ctl is None:
            pool = None if r.seeded else self._pools.setdefault(src, AcceptancePool(self.k_max))
            ctl = r.controllers[src] = GoodputController(self.k_max, src, pool=pool)
        r.controller, r.source = ctl, src

    def _step(self) -> None:
        batch = list(self._running)
        ks: list[int] = []
        for i, r in enumerate(batch):
            # Tokens the other sequences put in the same forward: k + 1 for those already chosen,
            # at least 1 (plain) for those still to choose.
            others = sum(k + 1 for k in ks) + (len(batch) - i - 1)
            ks.append(self._choose_k(r, others))
        lag = [self._lag(r) for r in batch]
        seen = [len(r.seq.history) for r in batch]
        try:
            res = speculative_step(
                self.target, self.drafter, [r.seq for r in batch], ks, [r.drafter_failed for r in batch]
            )
        except Exception as e:
            for r in batch:  # the target failed: a clear error to each request, KV freed
                self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            return
        self.cost.observe_forward(res.forward_tokens, res.forward_s)
        self._observe_draft_cost(batch, ks, res.drafted, lag, res.draft_s)
        for r, k, asked, n, extra in zip(batch, res.drafted, ks, seen, res.branch_rows, strict=True):
            r.last_source = r.source if k > 0 else None
            if k:
                self.cost.observe_branch(r.source, extra)  # priced into its K (CostModel.round_forward_time)
            if asked:
                r.synced[r.source] = n
        with self._lock:
            rows = zip(batch, res.drafted, res.accepted, res.emitted, res.draft_failed, res.approximate, res.errors,
                       res.sampled, strict=True)  # fmt: skip
            for r, k, a, kept, failed, approx, error, sampled in rows:
                if error is not None:
                    continue  # the request ends with the target's error below
                # Emitted = what the request kept: a stop string or max tokens may cut the block short.
                r.seq.stats.record_round(k, a, len(kept))
                r.seq.stats.approximate |= approx
                r.seq.stats.sampled_rounds += sampled
                r.seq.stats.draft_time_s += res.draft_s  # each request waits the whole round
                r.seq.stats.verify_time_s += res.forward_s
                self.stats.record_round(k, a, len(kept))
                r.drafter_failed |= failed
                if r.controller is not None and k:
                    r.controller.record(k, a)
                if self.drafter is not None and k:
                    try:
                        self.drafter.observe(r.seq.seq_id, r.seq.history, k, a)
                    except Exception:  # a drafter failure costs this request its drafts, nothing more
                        r.drafter_failed = True
            self.stats.draft_time_s += res.draft_s
            self.stats.verify_time_s += res.forward_s
        for r, emitted, error in zip(batch, res.emitted, res.errors, strict=True):
            if error is not None:
                self._finish(r, "error", error=error)
            else:
                self._emit(r, emitted)

    def _observe_draft_cost(
        self, batch: list[_Req], asked: list[int], drafted: list[int], lag: list[int], seconds: float
    ) -> None:
        """Price this round's draft call: by its longest draft in steady state, else its catch-up per token.

        Steady state (every drafting request drafted last round too) prices the call by the longest
        draft in it (each request waits for the whole call, and ``draft_time(k)`` is looked up per
        request's k; a model drafter's call takes one step per token of its longest draft). A
        call that also caught the drafter up on tokens it had missed (a request's prompt, the
        plain rounds since its last draft) is a cost of catching up, not of k: counted per k it
        would price a cheap steady-state drafter out for good; counted per caught-up token
        (only when one request drafted, so the excess is its own) the controller weighs it
        against what speculating would save (GoodputController.choose_k). Only once a steady-state
        call has been timed: before that the excess is unknown, and the whole call counted as
        catch-up (measured: 2.5 ms for one token, 35x the head's true price a token) priced the
        head out of short requests for good (it drafts no more, so it is never re-measured).
        """
        if self.drafter is None or not any(asked):
            return
        # The call's price goes to its source; a call mixing sources is priced as its costliest
        # (any but the drafter's plain name: lookups cost microseconds, a model's steps milliseconds).
        sources = {r.source for r, k in zip(batch, asked, strict=True) if k}
        name = next((x for x in sorted(sources) if x != self.drafter.name), self.drafter.name)
        longest = max(drafted)  # a request waits for the whole call: price it by its longest draft
        behind = [(k, n) for k, n in zip(asked, lag, strict=True) if k and n]
        if not behind:
            if longest:
                self.cost.observe_draft(name, longest, seconds)
        elif len([k for k in asked if k]) == 1 and self.cost.draft_priced(name):
            (k, n), = behind
            self.cost.observe_catch_up(name, n, seconds - self.cost.draft_time(name, max(longest, 1)))

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
