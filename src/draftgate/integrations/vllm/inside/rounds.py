"""One vLLM step's drafts: the proposer's logic, with no vLLM import (tested without vLLM).

vLLM's ``custom_class`` method calls the proposer once per engine step, after the target's
forward, with the batch's rows: each request's full history (prompt + output, this step's
tokens included) and how many tokens it sampled this step. vLLM then verifies the drafts
returned in the next step with its own rejection sampler (one-hot q: exact for greedy and
sampled requests alike). K and pricing are the engine's one speculation policy
(``engine.policy``, one per drafter, sharing one ``CostModel``); `ProposerCore.step` does, per call:

1. release the requests that left the batch (the suffix store keeps their output);
2. teach the policy the last round of each request still here (drafted k, accepted = sampled
   - 1), and price the step just run: a steady decode step (every row decoding, as in the step
   before) times a forward of that many tokens;
3. plan each row's round (the policy: 0 where the deployment's switch or the request's option
   is off, a fixed K where one is set, else its goodput controller, or every draft a lookup has);
4. draft, one batched call per drafter, each call timed for its drafter's price, and cut each
   lookup draft to what its evidence pays for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftgate.drafters.base import Draft, Drafter, DraftRequest
from draftgate.engine.costs import CostModel
from draftgate.engine.policy import SpeculationPolicy
from draftgate.engine.round import Round
from draftgate.integrations.vllm.contract import DrafterName, SettingsError
from draftgate.integrations.vllm.inside.settings import ProposerSettings, RequestOptions
from draftgate.types import MAX_NEW_TOKENS_LIMIT, SamplingParams

__all__ = ["Control", "DrafterStats", "ProposerCore", "Row"]

log = logging.getLogger("draftgate.integrations.vllm")

# Drafts are one-hot (vLLM verifies them against its own sampling); vLLM ends requests, not the proposer.
_GREEDY = SamplingParams(max_new_tokens=MAX_NEW_TOKENS_LIMIT)


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
class _Seq:
    """What a round reads of a vLLM request (``engine.round.SequenceView``): greedy, one-hot drafts."""

    seq_id: int
    history: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)  # vLLM keeps the output: the history is all the proposer sees
    params: SamplingParams = _GREEDY
    rand: Any = None  # never read: drafts are one-hot, verified by vLLM

    def append(self, tokens: Sequence[int]) -> list[int]:
        raise AssertionError("vLLM emits the tokens; the proposer never appends")


@dataclass
class _Req:
    seq: _Seq
    drafter: DrafterName
    last: Round | None = None  # the round whose drafts went to vLLM last step (its outcome comes next step)
    bad: bool = False  # invalid options: no drafts for this request


@dataclass
class _Step:
    rows: frozenset[str] = frozenset()  # requests decoding in the last step
    tokens: int = 0  # tokens that step's forward will carry (rows + their drafts)
    end: float = 0.0  # when the last call returned


class ProposerCore:
    """Drafts for each vLLM step, from DraftGate's drafters under the engine's speculation policy."""

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
        self.policies = {
            name: SpeculationPolicy(d, settings.k, settings.k_max, cost=self.cost) for name, d in self.drafters.items()
        }
        self.stats: dict[str, DrafterStats] = {d.value: DrafterStats() for d in self.drafters}
        self.requests_off = 0  # requests that asked for no speculation
        self.bad_requests = 0  # requests whose options were invalid
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
        for name in self.drafters:
            self._learn(name, [(r, q) for r, q in zip(rows, reqs, strict=True) if q.drafter is name])
        # 3-4. This step's rounds, planned, drafted and priced per drafter.
        rounds = [self._round(r, q) for r, q in zip(rows, reqs, strict=True)]
        for name in {q.drafter for q in reqs}:
            mine = [rnd for rnd, q in zip(rounds, reqs, strict=True) if q.drafter is name]
            self._draft(name, mine)
        for q, rnd in zip(reqs, rounds, strict=True):
            q.last = rnd if rnd.draft.token_ids else None
        drafts = [list(rnd.draft.token_ids) for rnd in rounds]
        self._last = _Step(decoding, sum(1 + len(d) for d in drafts), self._clock())
        return drafts

    def _admit(self, r: Row) -> _Req:
        q = self._reqs.get(r.req_id)
        if q is not None:
            q.seq.history = list(r.tokens)
            return q
        try:
            opts = RequestOptions.parse(r.extra_args, self.settings.k_max)
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
        q = self._reqs[r.req_id] = _Req(_Seq(self._next_seq, list(r.tokens)), name, bad=bad)
        self._next_seq += 1
        self.policies[name].open(q.seq.seq_id, _GREEDY, opts.speculate and not bad, k=opts.k)
        return q

    def _learn(self, name: DrafterName, done: Sequence[tuple[Row, _Req]]) -> None:
        """The rounds vLLM verified last step, to the drafter's policy and stats (accepted = sampled - 1)."""
        rounds = []
        for r, q in done:
            rnd, q.last = q.last, None
            if rnd is None or r.sampled <= 0:
                continue
            rnd.accepted = max(0, min(r.sampled - 1, rnd.drafted))
            rnd.emitted = rnd.kept = list(r.tokens[len(rnd.history) :])  # what vLLM emitted after the drafts
            rounds.append(rnd)
            s = self.stats[name.value]
            s.rounds += 1
            s.drafted += rnd.drafted
            s.accepted += rnd.accepted
        self.policies[name].update(rounds, price_forward=False)

    def _round(self, r: Row, q: _Req) -> Round:
        """The row's round, planned later per drafter: no drafts where the switch is off or after a prefill chunk."""
        k_max = self.settings.k_max if self.control.enabled and r.sampled > 0 and not q.bad else 0
        if self.settings.max_model_len is not None:  # vLLM drops drafts past the context anyway
            k_max = max(0, min(k_max, self.settings.max_model_len - len(r.tokens) - 1))
        return Round(_Seq(q.seq.seq_id, list(r.tokens)), k_max)

    def _draft(self, name: DrafterName, rounds: list[Round]) -> None:
        """Plan, draft (one timed call) and price this drafter's rounds."""
        policy, s = self.policies[name], self.stats[name.value]
        policy.plan(rounds)
        asked = [r for r in rounds if r.k]
        if not asked:
            return
        requests = [DraftRequest(r.seq_id, r.history, r.k, _GREEDY) for r in asked]
        t0 = self._clock()
        try:
            drafts = self.drafters[name].propose(requests)
        except Exception as e:  # a failed drafter costs these rows their drafts, nothing else
            s.failures += 1
            if s.failures == 1:
                log.warning(
                    "drafter %s failed (%s: %s); its rows decode without drafts", name.value, type(e).__name__, e
                )
            return
        seconds = self._clock() - t0
        s.calls += 1
        s.draft_s += seconds
        for r, d in zip(asked, drafts, strict=True):
            r.draft = Draft(list(d.token_ids[: r.k]), context=d.context)  # one-hot: vLLM verifies ids only
            r.draft_s = seconds
        policy.trim(rounds)

    def _release(self, req_id: str) -> None:
        q = self._reqs.pop(req_id)
        self.policies[q.drafter].close(q.seq.seq_id)
        try:
            self.drafters[q.drafter].release(q.seq.seq_id)
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
