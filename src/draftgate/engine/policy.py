"""The speculation policy: per sequence and round, which source drafts and how many tokens (K).

The engine's loop is plan -> run -> update. ``plan`` gives each running sequence a ``RoundPlan``
(its K and its source) from the goodput controllers and the measured costs; the step runs the
round (``engine.step``); ``update`` prices what the round cost (forward, draft call, catch-up,
draft-tree rows), teaches each source's controller its acceptance and tells the drafter the
outcome. Everything that decides K lives here; the engine keeps requests, stats and emission.

A drafter with several sources (``Abilities.sources``: auto's lookups and draft head) gets one
controller per source and per request: their acceptance and cost differ by far, and one
estimate for both would cut lookup's long drafts. A source that skipped rounds has the tokens
since its last draft to catch up on (a draft head absorbs the positions lookup drafted since).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from draftgate.drafters.base import Drafter
from draftgate.engine.controller import AcceptancePool, GoodputController
from draftgate.engine.costs import CostModel
from draftgate.engine.sequence import SequenceState
from draftgate.engine.step import StepResult
from draftgate.types import SamplingParams

__all__ = ["SpeculationPolicy", "SpecState", "RoundPlan"]

log = logging.getLogger(__name__)


@dataclass
class SpecState:
    """One request's speculation state, kept across its rounds."""

    speculate: bool = True  # False: this request decodes plainly (a canary's control arm, a lossless re-run)
    seeded: bool = False  # seeded sampling with a drafter that may sample q: K from its own tokens only
    drafter_failed: bool = False  # the drafter failed on this request: plain decoding from now on
    controller: GoodputController | None = None  # the controller of this round's source
    controllers: dict[str, GoodputController] = field(default_factory=dict)  # per source
    source: str = ""  # this round's source (the drafter's name when it has one only)
    last_source: str | None = None  # the source that drafted the previous round (None: none did)
    synced: dict[str, int] = field(default_factory=dict)  # per source, history length at its last draft


@dataclass(frozen=True)
class RoundPlan:
    """What the policy decided for one sequence this round."""

    k: int  # drafts asked (0: plain decoding)
    source: str  # the source that drafts them
    lag: int  # tokens the source has not drafted over (0 if it drafted the previous round)
    seen: int  # history length when planned
    hidden: bool  # the drafter failed on this request: it does not see it


class SpeculationPolicy:
    def __init__(self, drafter: Drafter | None, k: int | None, k_max: int) -> None:
        self.drafter = drafter
        self.k = k  # fixed K (None: the goodput controller chooses)
        self.k_max = k_max if drafter is not None else 0
        self.enabled = drafter is not None  # the runtime switch (routes, the admin kill switch)
        self.cost = CostModel()
        # Seeded sampling requests on a drafter that may send a sampled q (drafter.sampled_q) price
        # rounds with the cost prior, never with timings: with a sampled q, which positions are
        # drafted changes the tokens (a drafted position is verified by rejection, an undrafted one
        # sampled plainly), so a schedule that followed the clock or the batch would give a seed
        # different tokens from run to run. Never observed, so fixed.
        self._prior_cost = CostModel()
        self.acceptance = AcceptancePool(self.k_max)  # new requests start from it
        self._pools: dict[str, AcceptancePool] = {drafter.name: self.acceptance} if drafter else {}  # per source

    def open(self, params: SamplingParams, speculate: bool) -> SpecState:
        """A new request's state (``speculate=False``: it decodes plainly whatever the switch says)."""
        d = self.drafter
        seeded = params.seed is not None and not params.greedy and d is not None and d.sampled_q
        st = SpecState(speculate=speculate, seeded=seeded)
        if d is not None and self.k is None and self.k_max > 0:
            ctl = GoodputController(self.k_max, d.name, pool=None if seeded else self.acceptance)
            st.controller, st.controllers[d.name], st.source = ctl, ctl, d.name
        return st

    # ---------------------------------------------------------------- plan

    def plan(self, states: Sequence[SpecState], seqs: Sequence[SequenceState]) -> list[RoundPlan]:
        ks: list[int] = []
        for i, (st, s) in enumerate(zip(states, seqs, strict=True)):
            # Tokens the other sequences put in the same forward: k + 1 for those already chosen,
            # at least 1 (plain) for those still to choose.
            others = sum(k + 1 for k in ks) + (len(states) - i - 1)
            ks.append(self._choose_k(st, s, others))
        return [
            RoundPlan(k, st.source, self._lag(st, s), len(s.history), st.drafter_failed)
            for k, st, s in zip(ks, states, seqs, strict=True)
        ]

    def _choose_k(self, st: SpecState, s: SequenceState, other_tokens: int) -> int:
        if self.drafter is None or not self.enabled or st.drafter_failed or not st.speculate:
            return 0
        remaining = s.params.max_new_tokens - len(s.output)
        if st.controller is not None:
            self._pick_source(st, s)
        catch_up = self._lag(st, s)
        if st.controller is None:
            k = self.k
        elif st.seeded:  # the request's own acceptance and the cost prior: the same seed, the same schedule
            k = st.controller.choose_k(self._prior_cost, 0, catch_up, remaining)
        else:
            k = st.controller.choose_k(self.cost, other_tokens, catch_up, remaining)
        return max(0, min(k or 0, remaining - 1, self.k_max))

    @staticmethod
    def _lag(st: SpecState, s: SequenceState) -> int:
        """Tokens this round's source has not drafted over (0 if it drafted the previous round)."""
        return 0 if st.last_source == st.source else len(s.history) - st.synced.get(st.source, 0)

    def _pick_source(self, st: SpecState, s: SequenceState) -> None:
        """The controller of the source the drafter will draft this request's next round from."""
        chooser = self.drafter.abilities.sources if self.drafter is not None else None
        if chooser is None:
            return
        try:
            src = str(chooser.source(s.seq_id, s.history, self.k_max))
        except Exception:  # a drafter failure costs this request its drafts, nothing more
            log.exception("drafter source failed for sequence %d", s.seq_id)
            st.drafter_failed = True
            return
        ctl = st.controllers.get(src)
        if ctl is None:
            pool = None if st.seeded else self._pools.setdefault(src, AcceptancePool(self.k_max))
            ctl = st.controllers[src] = GoodputController(self.k_max, src, pool=pool)
        st.controller, st.source = ctl, src

    # ---------------------------------------------------------------- update

    def update(
        self, states: Sequence[SpecState], seqs: Sequence[SequenceState], plans: Sequence[RoundPlan], res: StepResult
    ) -> None:
        """Price the round, teach each source's controller, tell the drafter the outcomes."""
        self.cost.observe_forward(res.forward_tokens, res.forward_s)
        self._price_draft_call(plans, res)
        for st, s, p, rnd in zip(states, seqs, plans, res.rounds, strict=True):
            st.last_source = p.source if rnd.drafted > 0 else None
            if rnd.drafted:
                self.cost.observe_branch(p.source, rnd.branch_rows)  # priced into its K (round_forward_time)
            if p.k:
                st.synced[p.source] = p.seen
            if rnd.error is not None:
                continue  # the request ends with the target's error
            st.drafter_failed |= rnd.draft_failed
            if st.controller is not None and rnd.drafted:
                st.controller.record(rnd.drafted, rnd.accepted)
            if self.drafter is not None and rnd.drafted:
                try:
                    self.drafter.observe(s.seq_id, s.history, rnd.drafted, rnd.accepted)
                except Exception:  # a drafter failure costs this request its drafts, nothing more
                    st.drafter_failed = True

    def _price_draft_call(self, plans: Sequence[RoundPlan], res: StepResult) -> None:
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
        if self.drafter is None or not any(p.k for p in plans):
            return
        # The call's price goes to its source; a call mixing sources is priced as its costliest
        # (any but the drafter's plain name: lookups cost microseconds, a model's steps milliseconds).
        sources = {p.source for p in plans if p.k}
        name = next((x for x in sorted(sources) if x != self.drafter.name), self.drafter.name)
        longest = max(r.drafted for r in res.rounds)  # a request waits for the whole call
        behind = [p for p in plans if p.k and p.lag]
        if not behind:
            if longest:
                self.cost.observe_draft(name, longest, res.draft_s)
        elif len([p for p in plans if p.k]) == 1 and self.cost.draft_priced(name):
            (p,) = behind
            self.cost.observe_catch_up(name, p.lag, res.draft_s - self.cost.draft_time(name, max(longest, 1)))
