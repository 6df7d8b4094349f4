"""The speculation policy: per sequence and round, which source drafts and how many tokens (K).

One policy serves every loop that drafts: the engine (any round target), and the vLLM proposer
(``integrations.vllm.inside.rounds``). Each round it works on the sequences' ``Round`` records:

1. ``plan``: the source (``Abilities.sources``, or the drafter itself) and the most drafts to ask
   for. A lookup source is asked for every draft it has (proposing costs microseconds); a model
   source's K comes from the request's goodput controller (``engine.controller``: measured
   acceptance and costs, K down to 0, probes);
2. ``trim`` (after drafting): each lookup draft is cut to the K its evidence pays for
   (``engine.pricing``), or, on a target that prices drafts itself (``TargetInfo.pricer``), kept
   whole or dropped as the target says;
3. ``update``: the step's costs into the ``CostModel`` (forward by rows, draft calls, catch-up,
   draft-tree rows), each round's acceptance to its source's estimate, the outcome to the drafter.

Everything that decides K lives here; the loops keep requests, stats and emission. A request's
speculation state lives here too, from ``open`` to ``close``.

A source that skipped rounds has the tokens since its last draft to catch up on (a draft head
absorbs the positions lookup drafted since): the controller weighs that catch-up against what
speculating would save over the request's remaining tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from draftgate.drafters.base import Draft, Drafter, Source
from draftgate.engine.acceptance import AcceptancePool, AcceptanceTracker
from draftgate.engine.controller import EXPLORE, GoodputController
from draftgate.engine.costs import CostModel
from draftgate.engine.pricing import EvidencePricer
from draftgate.engine.round import Round
from draftgate.engine.target import DraftPricer
from draftgate.types import SamplingParams

__all__ = ["SpeculationPolicy", "SpecState"]

log = logging.getLogger(__name__)

FUNDS_CAP = 1.0  # a request banks at most this many plain tokens' time for probing lookup drafts


@dataclass
class SpecState:
    """One request's speculation state, kept across its rounds."""

    speculate: bool = True  # False: this request decodes plainly (a canary's control arm, a lossless re-run)
    seeded: bool = False  # seeded sampling with a drafter that may sample q: K from its own tokens only
    drafter_failed: bool = False  # the drafter failed on this request: plain decoding from now on
    controllers: dict[str, GoodputController] = field(default_factory=dict)  # per model source
    last_source: str | None = None  # the source that drafted the previous round (None: none did)
    synced: dict[str, int] = field(default_factory=dict)  # per source, history length at its last draft
    funds: float = 0.0  # seconds of lookup probes its plain rounds have paid for (EXPLORE of their time)
    k: int | None = None  # this request's own fixed K (None: the policy's)
    lookups: dict[tuple[str, int, bool], AcceptanceTracker] = field(default_factory=dict)  # own, per evidence band


class SpeculationPolicy:
    def __init__(
        self,
        drafter: Drafter | None,
        k: int | None,
        k_max: int,
        pricer: DraftPricer | None = None,
        cost: CostModel | None = None,
    ) -> None:
        """``k``: a fixed K (None: adaptive); ``pricer``: the target's own pricing of lookup drafts."""
        self.drafter = drafter
        self.k = k
        self.k_max = k_max if drafter is not None else 0
        self.enabled = drafter is not None  # the runtime switch (routes, the admin kill switch)
        self.cost = cost if cost is not None else CostModel()
        self.pricer = pricer
        # Seeded sampling requests on a drafter that may send a sampled q (drafter.sampled_q) price
        # rounds with the cost prior, never with timings: with a sampled q, which positions are
        # drafted changes the tokens (a drafted position is verified by rejection, an undrafted one
        # sampled plainly), so a schedule that followed the clock or the batch would give a seed
        # different tokens from run to run. Never observed, so fixed.
        self._prior_cost = CostModel()
        self.evidence = EvidencePricer(self.k_max)
        self._pools: dict[str, AcceptancePool] = {}  # per model source: new requests' alpha_1 prior
        self._states: dict[int, SpecState] = {}

    # ---------------------------------------------------------------- requests

    def open(self, seq_id: int, params: SamplingParams, speculate: bool = True, k: int | None = None) -> None:
        """A new request (``speculate=False``: it decodes plainly whatever the switch says; ``k``: its own
        fixed K)."""
        d = self.drafter
        seeded = params.seed is not None and not params.greedy and d is not None and d.sampled_q
        self._states[seq_id] = SpecState(speculate=speculate, seeded=seeded, k=k)

    def close(self, seq_id: int) -> None:
        """The request ended (idempotent)."""
        self._states.pop(seq_id, None)

    def state(self, seq_id: int) -> SpecState:
        return self._states[seq_id]

    @property
    def num_requests(self) -> int:
        return len(self._states)

    def pool(self, source: str) -> AcceptancePool | None:
        """A model source's acceptance pooled over requests (None: it never drafted)."""
        return self._pools.get(source)

    def controller(self, seq_id: int, source: str) -> GoodputController:
        """The request's goodput controller for a model source (the one place controllers are made)."""
        st = self._states[seq_id]
        ctl = st.controllers.get(source)
        if ctl is None:
            pool = None if st.seeded else self._pools.setdefault(source, AcceptancePool(self.k_max))
            ctl = st.controllers[source] = GoodputController(self.k_max, source, pool=pool)
        return ctl

    # ---------------------------------------------------------------- 1. plan

    def plan(self, rounds: Sequence[Round]) -> None:
        """Each round's source and the most drafts to ask for (``k``: 0 is a plain round)."""
        chosen = 0  # rows of the sequences already planned (k + 1 each)
        for i, r in enumerate(rounds):
            # Rows the other sequences put in the same forward: k + 1 for those already planned, at
            # least 1 (plain) for those still to plan.
            self._plan_one(r, chosen + (len(rounds) - i - 1))
            chosen += 1 if r.lookup else r.k + 1  # a lookup draft's rows are known once trimmed

    def _plan_one(self, r: Round, other_tokens: int) -> None:
        st = self._states[r.seq_id]
        r.k, r.hidden, r.probe, r.seen = 0, st.drafter_failed, False, len(r.history)
        if self.drafter is None or not self.enabled or st.drafter_failed or not st.speculate:
            return
        src = self._source(r, st)
        if src is None:
            return
        r.source, r.lookup = src.name, src.lookup
        r.lag = self._lag(st, r)
        fixed = st.k if st.k is not None else self.k
        if fixed is not None:
            k = fixed
        elif src.lookup:
            k = self.k_max  # everything it has: its draft is priced once proposed (trim)
        else:
            ctl = self.controller(r.seq_id, src.name)
            cost, other = (self._prior_cost, 0) if st.seeded else (self.cost, other_tokens)
            k = ctl.choose_k(cost, other, r.lag, r.remaining)
            r.probe = ctl.probing
        r.k = max(0, min(k, r.remaining - 1, r.k_max))

    def _source(self, r: Round, st: SpecState) -> Source | None:
        assert self.drafter is not None
        chooser = self.drafter.abilities.sources
        if chooser is None:
            return Source(self.drafter.name, self.drafter.abilities.lookup)
        try:
            return chooser.source(r.seq_id, r.history, self.k_max)
        except Exception:  # a drafter failure costs this request its drafts, nothing more
            log.exception("drafter source failed for sequence %d", r.seq_id)
            st.drafter_failed = r.hidden = True
            return None

    @staticmethod
    def _lag(st: SpecState, r: Round) -> int:
        """Tokens this round's source has not drafted over (0 if it drafted the previous round)."""
        return 0 if st.last_source == r.source else len(r.history) - st.synced.get(r.source, 0)

    # ---------------------------------------------------------------- 2. trim

    def trim(self, rounds: Sequence[Round]) -> None:
        """Cut each proposed lookup draft to the K its evidence pays for (adaptive K only)."""
        rows = [r.rows for r in rounds]  # before trimming: each round's pending token + its draft
        total = sum(rows)
        for r, n in zip(rounds, rows, strict=True):
            d, st = r.draft, self._states[r.seq_id]
            if not r.lookup or not d.token_ids or (st.k if st.k is not None else self.k) is not None:
                continue
            other = total - n
            if self.pricer is not None:
                k = len(d.token_ids) if self.pricer.worth(d.context, len(d.token_ids)) else 0
            else:
                own = self._own(st, r.source, d.context, r.params.greedy)
                k, r.probe = self.evidence.choose(
                    self.cost, r.source, d.context, len(d.token_ids), r.params.greedy, other, st.funds, own
                )
                if r.probe:
                    st.funds -= self.evidence.probe_cost(self.cost, r.source, other, k)
            if k < len(d.token_ids):
                r.draft = replace(d, token_ids=list(d.token_ids[:k])) if k else Draft([], context=d.context)
            total += k - len(d.token_ids)

    # ---------------------------------------------------------------- 3. update

    def update(self, rounds: Sequence[Round], price_forward: bool = True) -> None:
        """Price the step (``price_forward=False``: its caller times forwards itself), teach each source
        its acceptance, tell the drafter the outcomes."""
        if not rounds:
            return
        if price_forward:
            self.cost.observe_forward(sum(r.rows for r in rounds), rounds[0].forward_s)
        self._price_draft_call(rounds)
        t_plain = self.cost.forward_time(1, optimistic=True)
        for r in rounds:
            st = self._states.get(r.seq_id)
            if st is None:
                continue
            st.last_source = r.source if r.drafted > 0 else None
            if r.drafted:
                self.cost.observe_branch(r.source, r.branch_rows)  # priced into its K (round_forward_time)
            if r.k:
                st.synced[r.source] = r.seen
            if r.error is not None:
                continue  # the request ends with the target's error
            st.drafter_failed |= r.draft_failed
            self._learn(r, st, t_plain)
            if self.drafter is not None and r.drafted:
                try:
                    self.drafter.observe(r.seq_id, r.history, r.drafted, r.accepted)
                except Exception:  # a drafter failure costs this request its drafts, nothing more
                    st.drafter_failed = True

    def _learn(self, r: Round, st: SpecState, t_plain: float) -> None:
        """The round's acceptance to its source's estimate; a plain round pays for lookup probes."""
        if r.drafted:
            if r.lookup:
                self.evidence.record(r.source, r.draft.context, r.params.greedy, r.drafted, r.accepted)
                own = self._own(st, r.source, r.draft.context, r.params.greedy)
                own.record(min(r.drafted, self.k_max), min(r.accepted, r.drafted, self.k_max))
            elif r.source in st.controllers:
                st.controllers[r.source].record(r.drafted, r.accepted)
        elif st.speculate and self.drafter is not None:
            st.funds = min(st.funds + EXPLORE * t_plain, FUNDS_CAP * t_plain)

    def _own(self, st: SpecState, source: str, context: int, greedy: bool) -> AcceptanceTracker:
        key = (source, self.evidence.band(context), greedy)
        t = st.lookups.get(key)
        if t is None:
            t = st.lookups[key] = self.evidence.own()
        return t

    def _price_draft_call(self, rounds: Sequence[Round]) -> None:
        """Price this step's draft call: by its longest draft in steady state, else its catch-up per token.

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
        asked = [r for r in rounds if r.k]
        if self.drafter is None or not asked:
            return
        # The call's price goes to its source; a call mixing sources is priced as its costliest
        # (a model source: lookups cost microseconds, a model's steps milliseconds).
        name = next((r.source for r in asked if not r.lookup), asked[0].source)
        longest = max(len(r.draft.token_ids) for r in asked)  # a request waits for the whole call
        draft_s = rounds[0].draft_s
        behind = [r for r in asked if r.lag]
        if not behind:
            if longest:
                self.cost.observe_draft(name, longest, draft_s)
        elif len(asked) == 1 and self.cost.draft_priced(name):
            (r,) = behind
            self.cost.observe_catch_up(name, r.lag, draft_s - self.cost.draft_time(name, max(longest, 1)))
