"""Adaptive K: how many draft tokens a request speculates each round.

The controller maximizes *goodput*, the request's expected emitted tokens per
second of step time (marginal view: its own tokens over the whole shared step):

    goodput(K) = E[tokens | K] / (t_draft(K) + t_forward(other + K + 1))

E[tokens | K] = 1 + sum_{j=1..K} prod_{i<=j} alpha_i counts the recovered or
bonus token, so plain decoding (K = 0) emits exactly 1. alpha_i = P(accept
draft i | drafts 1..i-1 accepted), estimated per request over a sliding window.

Costs are *measured, never configured*: the engine times every target forward
and draft call into one shared `CostModel` (engine.costs), which the controller
reads. Pure Python, no torch, no I/O; each call is O(K_max) plus a few bisections.
"""

from __future__ import annotations

import math
from typing import Final

from draftgate.engine.acceptance import AcceptancePool, AcceptanceTracker
from draftgate.engine.costs import CATCH_UP_RETRY, CostModel

__all__ = ["GoodputController", "goodputs", "down_probe_due"]

NEAR_TIE: Final = 0.02  # goodputs within 2% tie; the smaller K wins (K = 0 included)
OPTIMISM: Final = 1.5  # posterior sds added to each alpha when a probe weighs its catch-up
EXPLORE: Final = 0.02  # share of plain decoding's time that probes may cost (GoodputController._funded_probe)
SURPRISE: Final = 0.01  # a probe this unlikely under the window's estimates discards the window
POOL_WEIGHT: Final = 4.0  # a pooled prior counts as this many of the request's own rounds
# Plain decoding's cost is only measured in K = 0 rounds, which speculation stops running: while
# speculating, re-measure it with one K = 0 round ("down-probe") this often (forwards of any
# request since plain's size was last timed), sooner while it has few timings; one slow first
# timing (a GC pause) must not keep a losing speculation on for good.
DOWN_PROBE_EVERY: Final = 128
DOWN_PROBE_EVERY_FEW: Final = 16
FEW_PLAIN_TIMINGS: Final = 5
# A probe whose catch-up looks too dear to repay goes ahead anyway while the drafter's catch-up
# price rests on fewer timings than this: a refused probe measures nothing, so one slow first
# timing (a cold call, a GC pause) would otherwise price the drafter out of short requests for good
# (a loaded CI run: the head drafted 2 tokens in 93 rounds). An expensive drafter pays for such
# probes only until its window holds this many timings.
FEW_CATCH_UPS: Final = 3
# Settled at K = 0 with nothing learned since, a controller re-weighs its costs (and whether a probe is
# paid for yet) only every RECHECK_EVERY rounds, and when its back-off interval is reached: a decision
# that costs ~50 us of Python a round after a forward's cold caches, for costs that drift over minutes.
RECHECK_EVERY: Final = 8
# It also goes ahead once the catch-up price is CATCH_UP_RETRY forwards old (engine.costs).


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0.0 else math.inf


def goodputs(alphas: list[float], steps: list[float]) -> list[float]:
    """[k-1]: expected tokens per second of a round drafting k, E[tokens | k] / steps[k-1]."""
    out, total, run = [], 1.0, 1.0
    for a, step in zip(alphas, steps, strict=True):
        run *= a
        total += run
        out.append(_rate(total, step))
    return out


def best_k(alphas: list[float], steps: list[float], t_plain: float) -> int:
    """The K of the best expected goodput, the smallest within NEAR_TIE of it; 0 unless it beats
    plain decoding (one token in ``t_plain``) by NEAR_TIE."""
    if not steps:
        return 0
    mean = goodputs(alphas, steps)
    best = max(mean)
    if best < _rate(1.0, t_plain) * (1.0 + NEAR_TIE):
        return 0
    return next(k for k, g in enumerate(mean, start=1) if g >= best * (1.0 - NEAR_TIE))


def funded_k(top: int, steps: list[float], t_plain: float, funds: float) -> int:
    """The longest probe up to ``top`` drafts whose round, should it emit one token, costs at most
    ``funds`` more than a plain round (0: none yet). Probes spend what EXPLORE of the plain rounds
    since the last probe earned: where rows are dear (AVX2: a second row costs 30% of a one-row
    pass) they come rarely and short, where they are cheap (VNNI: 5%) as often as allowed; either
    way probing costs at most EXPLORE of plain decoding's time."""
    return next((k for k in range(min(top, len(steps)), 0, -1) if steps[k - 1] - t_plain <= funds), 0)


def down_probe_due(cost: CostModel, plain: int) -> bool:
    """Whether a round that would draft should run plainly instead, to re-measure plain decoding."""
    if not cost.measured(plain):
        return False  # the controllers run plain first while its cost is only a guess
    every = DOWN_PROBE_EVERY_FEW if cost.timings(plain) < FEW_PLAIN_TIMINGS else DOWN_PROBE_EVERY
    return cost.staleness(plain) >= every


class GoodputController:
    """Chooses K in [0, k_max] for one request; call `choose_k`, then `record`, each round.

    K > 0 is the best expected goodput (near-ties to the smaller K), when it beats
    plain decoding by NEAR_TIE. At K = 0 it probes once `probe_interval` zero
    rounds have passed and have paid for the probe (``funded_k``: EXPLORE of their
    time); a probe that accepts nothing doubles the interval (up to
    max_probe_interval), any win for speculation resets it, and probes far
    better than the window predicts (together P < 1%) discard the stale window.

    With a `pool` (one per engine and drafter) the request starts from the
    pooled alpha_1 instead of a fixed prior, and feeds its rounds back. The
    default probe_k is the K that would be best at that prior (at least 1): a
    cheap drafter that pays when it hits probes long, an expensive one that
    rarely hits probes short, so probing costs little where it finds little.
    """

    def __init__(
        self,
        k_max: int,
        drafter: str,
        probe_interval: int = 8,
        max_probe_interval: int = 128,
        probe_k: int | None = None,
        window: int = 64,
        pool: AcceptancePool | None = None,
    ) -> None:
        if not 1 <= probe_interval <= max_probe_interval:
            raise ValueError("need 1 <= probe_interval <= max_probe_interval")
        if pool is not None and pool.k_max != k_max:
            raise ValueError(f"pool is for k_max={pool.k_max}, controller has k_max={k_max}")
        # Only alpha_1 is pooled: later positions chain from the request's own alpha_1. Pooled
        # alpha_2.. (n-gram: ~0.9, learned on grounded requests) made every open-chat request
        # explore long drafts, each wrong one a (K+1)-row verify.
        prior = pool.alpha() if pool is not None and pool.ready() and k_max > 0 else None
        self.tracker = AcceptanceTracker(  # validates k_max and window
            k_max,
            window=window,
            prior_alpha=0.5 if prior is None else prior,
            prior_weight=2.0 if prior is None else POOL_WEIGHT,
        )
        if probe_k is not None and k_max > 0 and not 1 <= probe_k <= k_max:
            raise ValueError(f"probe_k must be in [1, {k_max}], got {probe_k!r}")
        self.k_max, self.drafter, self.pool = k_max, drafter, pool
        self.probe_interval, self.max_probe_interval = probe_interval, max_probe_interval
        self.probe_k = probe_k if k_max > 0 else 0  # None: sized at each probe
        self.interval = probe_interval  # current back-off interval
        self.last_k = 0
        self.probes = 0
        self.down_probes = 0
        self._zero_run = 0  # consecutive K = 0 rounds since the last probe
        self._probing = False  # the last choose_k returned a probe ...
        self._probe_seen = False  # ... and its outcome has been recorded
        self._probe_hit = False  # ... and it accepted a draft
        self._streak = 1.0  # P(the outcomes of the probes since the last that accepted nothing)
        self._settled: int | None = None  # other_tokens of a decision for plain decoding with nothing learned since

    @property
    def probing(self) -> bool:
        """The last ``choose_k`` returned a probe (a round to measure, not one expected to pay)."""
        return self._probing and not self._probe_seen

    def choose_k(self, cost: CostModel, other_tokens: int = 0, catch_up: int = 0, remaining: int | None = None) -> int:
        """K for this round.

        other_tokens: tokens other sequences put in the same forward. catch_up: tokens the
        drafter has not seen yet (the whole history before a request's first draft, the plain
        rounds' tokens after a pause), which drafting now must pay for once; it is paid only
        if speculating over the ``remaining`` tokens of the request (None: unbounded) saves
        more time than it costs, so an expensive drafter is not started where it cannot win.
        """
        if other_tokens < 0:
            raise ValueError(f"other_tokens must be >= 0, got {other_tokens!r}")
        if self.k_max == 0:
            return 0
        if self._settled == other_tokens and self._zero_run % RECHECK_EVERY and self._zero_run != self.interval:
            self._zero_run += 1  # settled at plain decoding, nothing learned since, no probe due: it stands
            return 0
        steps = self._step_times(cost, other_tokens)  # [k-1]: a round drafting k
        t_plain = cost.forward_time(other_tokens + 1, optimistic=True)
        k = best_k(self.tracker.alphas(), steps, t_plain)
        self._settled = other_tokens if k == 0 else None
        if k > 0 and not self._worth_catching_up(cost, steps, t_plain, catch_up, remaining, k, z=0.0):
            k = 0
        if k > 0 and down_probe_due(cost, other_tokens + 1):
            self.down_probes += 1
            self.last_k = 0
            return 0  # re-measure plain decoding (speculation goes on next round)
        if self._probing:
            self._probing = False
            if k == 0 and self._probe_seen and not self._probe_hit:  # the probe confirmed plain decoding: back off
                self.interval = min(2 * self.interval, self.max_probe_interval)
        if k > 0:
            self.interval, self._zero_run = self.probe_interval, 0
        elif self._zero_run >= self.interval:
            # A catch-up price resting on few timings, or old, is measured again (a probe goes ahead
            # on its rows' funds alone); a known one is paid from the funds too, if it can repay at all.
            measure = (
                cost.catch_up_timings(self.drafter) < FEW_CATCH_UPS
                or cost.catch_up_staleness(self.drafter) >= CATCH_UP_RETRY
            )
            t_catch = 0.0 if measure else cost.catch_up_time(self.drafter, catch_up)
            k = self._funded_probe(cost, steps, t_plain, t_catch)
            if (
                k
                and not measure
                and not self._worth_catching_up(cost, steps, t_plain, catch_up, remaining, k, z=OPTIMISM)
            ):
                self._zero_run, k = 0, 0  # even an optimistic probe would not repay its catch-up: back off without it
                self.interval = min(2 * self.interval, self.max_probe_interval)
            elif k:
                self._zero_run = 0
                self._probing, self._probe_seen = True, False
                self.probes += 1
            else:
                self._zero_run += 1  # not paid for yet
        else:
            self._zero_run += 1
        if k or self._probing:
            self._settled = None
        self.last_k = k
        return k

    def _worth_catching_up(
        self,
        cost: CostModel,
        steps: list[float],
        t_plain: float,
        catch_up: int,
        remaining: int | None,
        k: int,
        z: float,
    ) -> bool:
        """Whether drafting k now, after catching the drafter up on catch_up tokens, can pay off:
        the time speculation at this K saves over the remaining tokens exceeds the catch-up."""
        t_catch = cost.catch_up_time(self.drafter, catch_up)
        if t_catch <= 0.0 or remaining is None:
            return True
        plain_rate = _rate(1.0, t_plain)
        spec_rate = goodputs(self.tracker.alphas(k, z=z), steps[:k])[-1]
        if spec_rate <= plain_rate:
            return False
        return remaining * (1.0 / plain_rate - 1.0 / spec_rate) > t_catch

    def record(self, k: int, accepted: int) -> None:
        """Outcome of the round: k drafts verified, the first `accepted` kept (k == 0: ignored)."""
        if k == 0:
            return
        self._settled = None
        if self.pool is not None:
            self.pool.record(k, accepted)
        if self._probing and not self._probe_seen:
            self._probe_seen, self._probe_hit = True, accepted > 0
            # Probes that keep accepting more than the window predicts (together less likely than
            # SURPRISE: one long probe, or a few short ones where rows are dear) mean the window (and
            # any pooled prior) predates a change: start again from the probe.
            self._streak = self._streak * self.tracker.prob_at_least(accepted) if accepted else 1.0
            if self._streak < SURPRISE:
                self.tracker = AcceptanceTracker(self.k_max, window=self.tracker.window)
                self._streak = 1.0
        self.tracker.record(k, accepted)

    def _funded_probe(self, cost: CostModel, steps: list[float], t_plain: float, t_catch: float = 0.0) -> int:
        """The probe (``funded_k``) that the plain rounds since the last one paid for, its catch-up
        (``t_catch``) included, at most ``probe_k`` or the K best at the prior (pooled, else the
        neutral one); 0: none yet."""
        if self.probe_k:
            top = self.probe_k
        else:
            rates = goodputs([self.tracker.prior_alpha] * self.k_max, steps)  # an empty window's alphas
            top = rates.index(max(rates)) + 1
        return funded_k(top, steps, t_plain, EXPLORE * self._zero_run * t_plain - t_catch)

    def _step_times(self, cost: CostModel, other_tokens: int) -> list[float]:
        """[k-1]: estimated seconds of a round drafting k (unmeasured forward sizes optimistic; the
        drafter's draft tree rows as often as they come)."""
        plain = other_tokens + 1
        return [
            cost.draft_time(self.drafter, k) + cost.round_forward_time(self.drafter, plain + k)
            for k in range(1, self.k_max + 1)
        ]

    def snapshot(self) -> dict[str, object]:
        """Small stats view: alphas, back-off interval, last K, probes so far."""
        return {
            "alphas": [round(a, 4) for a in self.tracker.alphas()],
            "interval": self.interval,
            "last_k": self.last_k,
            "zero_run": self._zero_run,
            "probes": self.probes,
            "window_rounds": len(self.tracker),
        }
