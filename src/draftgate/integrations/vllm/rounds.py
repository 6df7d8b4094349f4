"""One vLLM step's drafts: the proposer's logic, with no vLLM import (tested without vLLM).

vLLM's ``custom_class`` method calls the proposer once per engine step, after the target's
forward, with the batch's rows: each request's full history (prompt + output, this step's
tokens included) and how many tokens it sampled this step. vLLM then verifies the drafts
returned in the next step with its own rejection sampler (one-hot q: exact for greedy and
sampled requests alike). `ProposerCore.step` does, per call:

1. release the requests that left the batch (the suffix store keeps their output);
2. score the last round of each request still here (drafted k, accepted = sampled - 1) for
   its drafter and its goodput controller, and price the step just run: a steady decode step
   (every row decoding, as in the step before) times a forward of that many tokens;
3. choose K per row: 0 where the deployment's switch or the request's option is off, a fixed
   K where one is set, else the request's goodput controller (engine.controller, K down to 0);
4. draft, one batched call per drafter, each call timed for its drafter's price.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftgate.drafters.base import Drafter, DraftRequest
from draftgate.engine.controller import AcceptancePool, GoodputController
from draftgate.engine.costs import CostModel
from draftgate.integrations.vllm.settings import (
    DrafterName,
    ProposerSettings,
    RequestOptions,
    SettingsError,
)
from draftgate.types import SamplingParams

__all__ = ["Control", "DrafterStats", "ProposerCore", "Row"]

log = logging.getLogger("draftgate.integrations.vllm")

_GREEDY = SamplingParams()  # drafts are one-hot: vLLM verifies them against its own sampling


@dataclass(frozen=True)
class Row:
    """One request in a vLLM step."""

    req_id: str
    tokens: Sequence[int]  # prompt + output so far, this step's sampled tokens included
    sampled: int  # tokens vLLM sampled for it this step (0: a prefill chunk, nothing to draft after)
    extra_args: Mapping[str, Any] | None = None  # the request's vllm_xargs


@dataclass
class Control:
    """The deployment's switch, flipped at run time (the side server's ``/control``)."""

    enabled: bool = True


@dataclass
class DrafterStats:
    """One drafter's totals in this vLLM process (collected here, reported by the sinks)."""

    rounds: int = 0  # rounds that drafted at least one token
    drafted: int = 0  # draft tokens handed to vLLM
    accepted: int = 0  # of them, accepted by vLLM's verification
    calls: int = 0  # draft calls (one per step that drafted with this drafter)
    draft_s: float = 0.0  # seconds spent in those calls
    failures: int = 0  # calls that raised (their rows got no drafts)


@dataclass
class _Req:
    seq_id: int
    drafter: DrafterName
    options: RequestOptions
    controller: GoodputController | None
    drafted: int = 0  # drafts handed to vLLM last step
    bad: bool = False  # invalid options: no drafts for this request


@dataclass
class _Step:
    rows: frozenset[str] = frozenset()  # requests decoding in the last step
    tokens: int = 0  # tokens that step's forward will carry (rows + their drafts)
    end: float = 0.0  # when the last call returned


class ProposerCore:
    """Drafts for each vLLM step, from DraftGate's drafters under the goodput controller."""

    def __init__(
        self,
        settings: ProposerSettings,
        drafters: Mapping[DrafterName, Drafter],
        control: Control | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if settings.drafter not in drafters:
            raise SettingsError(f"drafter {settings.drafter.value!r} is not available here")
        self.settings, self.drafters = settings, dict(drafters)
        self.control = control or Control()
        self.cost = CostModel()
        self.stats: dict[str, DrafterStats] = {d.value: DrafterStats() for d in self.drafters}
        self.requests_off = 0  # requests that asked for no speculation
        self.bad_requests = 0  # requests whose options were invalid
        self._pools = {d: AcceptancePool(settings.k_max) for d in self.drafters}
        self._reqs: dict[str, _Req] = {}
        self._next_seq = 1
        self._last = _Step()
        self._clock = clock

    @property
    def num_requests(self) -> int:
        return len(self._reqs)

    def known(self, req_id: str) -> bool:
        """Whether the request has been seen (its options are read once, on first sight)."""
        return req_id in self._reqs

    def step(self, rows: Sequence[Row]) -> list[list[int]]:
        """Draft token ids per row (empty where nothing is drafted)."""
        now = self._clock()
        present = {r.req_id for r in rows}
        # 1. Requests that left the batch.
        for req_id in [q for q in self._reqs if q not in present]:
            self._release(req_id)
        # 2. Last round's outcomes; the step's price.
        decoding = frozenset(r.req_id for r in rows if r.sampled > 0)
        if rows and decoding == self._last.rows and len(decoding) == len(rows):
            self.cost.observe_forward(self._last.tokens, now - self._last.end)
        reqs = [self._admit(r) for r in rows]
        for r, q in zip(rows, reqs, strict=True):
            if q.drafted and r.sampled > 0:
                self._score(r, q)
        # 3. K per row.
        ks = self._choose_ks(rows, reqs)
        # 4. Drafts, one call per drafter.
        drafts: list[list[int]] = [[] for _ in rows]
        for name in {q.drafter for q, k in zip(reqs, ks, strict=True) if k > 0}:
            idx = [i for i, (q, k) in enumerate(zip(reqs, ks, strict=True)) if k > 0 and q.drafter is name]
            for i, d in zip(idx, self._draft(name, [rows[i] for i in idx], [reqs[i] for i in idx], [ks[i] for i in idx]), strict=True):
                drafts[i] = d
        for q, d in zip(reqs, drafts, strict=True):
            q.drafted = len(d)
        self._last = _Step(decoding, sum(1 + len(d) for d in drafts), self._clock())
        return drafts

    def _admit(self, r: Row) -> _Req:
        q = self._reqs.get(r.req_id)
        if q is not None:
            return q
        k_max = self.settings.k_max
        try:
            opts = RequestOptions.parse(r.extra_args, k_max)
            if opts.drafter is not None and opts.drafter not in self.drafters:
                raise SettingsError(f"draftgate_drafter {opts.drafter.value!r} is not configured on this deployment")
            bad = False
        except SettingsError as e:
            log.warning("request %s: %s; it decodes without drafts", r.req_id, e)
            opts, bad = RequestOptions(speculate=False), True
            self.bad_requests += 1
        if not opts.speculate and not bad:
            self.requests_off += 1
        name = opts.drafter or self.settings.drafter
        fixed = opts.k if opts.k is not None else self.settings.k
        ctl = None if fixed is not None else GoodputController(k_max, name.value, pool=self._pools[name])
        q = self._reqs[r.req_id] = _Req(self._next_seq, name, opts, ctl, bad=bad)
        self._next_seq += 1
        return q

    def _score(self, r: Row, q: _Req) -> None:
        accepted = max(0, min(r.sampled - 1, q.drafted))
        s = self.stats[q.drafter.value]
        s.rounds += 1
        s.drafted += q.drafted
        s.accepted += accepted
        if q.controller is not None:
            q.controller.record(q.drafted, accepted)
        try:
            self.drafters[q.drafter].observe(q.seq_id, r.tokens, q.drafted, accepted)
        except Exception as e:  # bookkeeping: it must not end anyone's request
            log.warning("drafter %s observe failed: %s: %s", q.drafter.value, type(e).__name__, e)

    def _choose_ks(self, rows: Sequence[Row], reqs: Sequence[_Req]) -> list[int]:
        on = self.control.enabled
        ks, other = [], len(rows) - 1  # other rows' tokens in the same forward, drafts added as chosen
        for r, q in zip(rows, reqs, strict=True):
            if not on or q.bad or not q.options.speculate or r.sampled == 0:
                k = 0
            elif q.controller is None:
                k = q.options.k if q.options.k is not None else (self.settings.k or 0)
            else:
                k = q.controller.choose_k(self.cost, other)
            if self.settings.max_model_len is not None:  # vLLM drops drafts past the context anyway
                k = max(0, min(k, self.settings.max_model_len - len(r.tokens) - 1))
            ks.append(k)
            other += k
        return ks

    def _draft(self, name: DrafterName, rows: Sequence[Row], reqs: Sequence[_Req], ks: Sequence[int]) -> list[list[int]]:
        s = self.stats[name.value]
        requests = [DraftRequest(q.seq_id, r.tokens, k, _GREEDY) for r, q, k in zip(rows, reqs, ks, strict=True)]
        t0 = self._clock()
        try:
            drafts = self.drafters[name].propose(requests)
        except Exception as e:  # a failed drafter costs these rows their drafts, nothing else
            s.failures += 1
            if s.failures == 1:
                log.warning("drafter %s failed (%s: %s); its rows decode without drafts", name.value, type(e).__name__, e)
            return [[] for _ in rows]
        seconds = self._clock() - t0
        s.calls += 1
        s.draft_s += seconds
        self.cost.observe_draft(name.value, max(ks), seconds)
        return [[int(t) for t in d.token_ids[:k]] for d, k in zip(drafts, ks, strict=True)]

    def _release(self, req_id: str) -> None:
        q = self._reqs.pop(req_id)
        try:
            self.drafters[q.drafter].release(q.seq_id)
        except Exception as e:
            log.warning("drafter %s release failed: %s: %s", q.drafter.value, type(e).__name__, e)

    def snapshot(self) -> dict[str, object]:
        """Totals for the JSON sink: per drafter, and the deployment's switch."""
        return {
            "speculation_enabled": self.control.enabled,
            "requests": self.num_requests,
            "requests_off": self.requests_off,
            "bad_requests": self.bad_requests,
            "drafters": {name: vars(s).copy() for name, s in self.stats.items()},
        }
