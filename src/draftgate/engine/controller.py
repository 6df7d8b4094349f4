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
from collections import deque
from typing import Final

from draftgate.engine.costs import CATCH_UP_RETRY, CostModel

__all__ = ["AcceptancePool", "AcceptanceTracker", "GoodputController"]

NEAR_TIE: Final = 0.02  # goodputs within 2% tie; the smaller K wins (K = 0 included)
OPTIMISM: Final = 1.5  # posterior sds added to each alpha before K = 0 may be concluded
SURPRISE: Final = 0.01  # a probe this unlikely under the window's estimates discards the window
POOL_MIN_ROUNDS: Final = 8.0  # a pool this thin is not yet a prior
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
# It also goes ahead once the catch-up price is CATCH_UP_RETRY forwards old (engine.costs).


def _rate(tokens: float, seconds: float) -> float:
    return tokens / seconds if seconds > 0.0 else math.inf



class AcceptanceTracker:
    """Per-position conditional acceptance of one request over its last `window` rounds.

    A round that drafted k tokens and accepted a of them tried positions
    1..min(a+1, k) and accepted 1..a. The estimate is
    alpha_i = (accepted_i + w * m_i) / (tried_i + w) with w = prior_weight and
    prior mean m_1 = prior_alpha, m_i = alpha_{i-1}: a position the request
    rarely reaches inherits the one before it rather than a fixed guess.
    """

    def __init__(
        self, k_max: int, window: int = 64, prior_alpha: float = 0.5, prior_weight: float = 2.0
    ) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if not 0.0 <= prior_alpha <= 1.0:
            raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha!r}")
        if not prior_weight > 0.0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight!r}")
        self.k_max, self.window = k_max, window
        self.prior_alpha, self.prior_weight = prior_alpha, prior_weight
        self._rounds: deque[tuple[int, int]] = deque()  # (k, accepted), oldest first
        self._tried = [0] * k_max  # [i]: rounds in the window that reached position i+1
        self._acc = [0] * k_max  # [i]: rounds in the window that accepted position i+1

    def __len__(self) -> int:
        """Rounds currently in the window."""
        return len(self._rounds)

    def record(self, k: int, accepted: int) -> None:
        """A verified round drafted k tokens and kept the first `accepted` (k == 0: ignored)."""
        if not 0 <= k <= self.k_max:
            raise ValueError(f"k must be in [0, {self.k_max}], got {k!r}")
        if not 0 <= accepted <= k:
            raise ValueError(f"accepted must be in [0, {k}], got {accepted!r}")
        if k == 0:
            return
        if len(self._rounds) == self.window:  # ring buffer: drop the oldest in O(1)
            self._add(*self._rounds.popleft(), sign=-1)
        self._rounds.append((k, accepted))
        self._add(k, accepted, sign=1)

    def _add(self, k: int, accepted: int, sign: int) -> None:
        for i in range(min(accepted + 1, k)):
            self._tried[i] += sign
        for i in range(accepted):
            self._acc[i] += sign

    def clear(self) -> None:
        """Forget every round (the estimates return to the prior)."""
        self._rounds.clear()
        self._tried = [0] * self.k_max
        self._acc = [0] * self.k_max

    def alphas(self, k: int | None = None, z: float = 0.0) -> list[float]:
        """alpha_1..alpha_k (default k_max); z > 0 adds z posterior sds (capped at 1)."""
        k = self.k_max if k is None else k
        if not 0 <= k <= self.k_max:
            raise ValueError(f"k must be in [0, {self.k_max}], got {k!r}")
        out, m, w = [], self.prior_alpha, self.prior_weight
        for i in range(k):
            n = self._tried[i] + w
            m = (self._acc[i] + w * m) / n  # the mean, and the next position's prior mean
            out.append(min(1.0, m + z * math.sqrt(m * (1.0 - m) / (n + 1.0))) if z else m)
        return out

    def expected_tokens(self, k: int, z: float = 0.0) -> float:
        """Expected tokens emitted by a round drafting k: 1 + sum_j prod_{i<=j} alpha_i."""
        total, run = 1.0, 1.0
        for a in self.alphas(k, z):
            run *= a
            total += run
        return total

    def prob_at_least(self, m: int) -> float:
        """P(a round accepts at least m drafts) = prod_{i<=m} alpha_i under the estimates."""
        return math.prod(self.alphas(m))


class AcceptancePool:
    """One drafter's first-draft acceptance pooled over all requests of an engine.

    Rounds that tried draft 1 and rounds that accepted it, decayed by
    (1 - 1/horizon) per recorded round so the pool follows the traffic. A new
    request's controller takes `alpha()` as its alpha_1 prior (a drafter that
    never hits starts at K = 0 instead of relearning it per request) and sizes
    its probes by it; later positions chain from the request's own alpha_1.
    Not locked: callers record under their own lock.
    """

    def __init__(self, k_max: int, horizon: int = 256) -> None:
        if k_max < 0:
            raise ValueError(f"k_max must be >= 0, got {k_max!r}")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon!r}")
        self.k_max = k_max
        self._decay = 1.0 - 1.0 / horizon
        self.rounds = 0.0  # decayed count of rounds that drafted (each tried draft 1)
        self._accepted = 0.0  # decayed count of rounds that accepted draft 1

    def record(self, k: int, accepted: int) -> None:
        """A verified round of any request drafted k and kept `accepted` (k == 0: ignored)."""
        if not 0 <= accepted <= k <= self.k_max:
            raise ValueError(f"need 0 <= accepted <= k <= {self.k_max}, got k={k!r}, accepted={accepted!r}")
        if k == 0:
            return
        self.rounds = self.rounds * self._decay + 1.0
        self._accepted = self._accepted * self._decay + (1.0 if accepted else 0.0)

    def ready(self) -> bool:
        """Whether enough rounds were pooled to serve as a prior."""
        return self.rounds >= POOL_MIN_ROUNDS

    def alpha(self, prior_alpha: float = 0.5, prior_weight: float = 2.0) -> float:
        """Pooled alpha_1, smoothed like `AcceptanceTracker.alphas`."""
        return (self._accepted + prior_weight * prior_alpha) / (self.rounds + prior_weight)


def _goodputs(alphas: list[float], steps: list[float]) -> list[float]:
    out, total, run = [], 1.0, 1.0
    for a, step in zip(alphas, steps, strict=True):
        run *= a
        total += run
        out.append(_rate(total, step))
    return out


class GoodputController:
    """Chooses K in [0, k_max] for one request; call `choose_k`, then `record`, each round.

    K > 0 is the best expected goodput (near-ties to the smaller K). Plain
    decoding (K = 0) needs even optimistic alphas (mean + 1.5 sd) to lose, so a
    bad-luck streak cannot park the request where only probes refresh the
    estimates. At K = 0 it drafts `probe_k` once after `probe_interval` zero
    rounds; a probe confirming K = 0 doubles the interval (up to
    max_probe_interval), any win for speculation resets it, and a probe far
    better than the window predicts (P < 1%) discards the stale window.

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

    def choose_k(
        self, cost: CostModel, other_tokens: int = 0, catch_up: int = 0, remaining: int | None = None
    ) -> int:
        """K for this round.

        other_tokens: tokens other sequences put in the same forward. catch_up: tokens the
        drafter has not seen yet (the whole history before a request's first draft, the plain
        rounds' tokens after a pause), which drafting now must pay for once; it is paid only
        if speculating over the ``remaining`` tokens of the request (None: unbounded) saves
        more time than it costs, so an expensive drafter is not started where it cannot win.
        """
        if other_tokens < 0:
            raise ValueError(f"other_tokens must be >= 0, got {other_tokens!r}")
        k = self._best_k(cost, other_tokens)
        if k > 0 and not self._worth_catching_up(cost, other_tokens, catch_up, remaining, k, z=0.0):
            k = 0
        if k > 0 and self._down_probe_due(cost, other_tokens + 1):
            self.down_probes += 1
            self.last_k = 0
            return 0  # re-measure plain decoding (speculation goes on next round)
        if self._probing:
            self._probing = False
            if k == 0 and self._probe_seen:  # the probe confirmed plain decoding: back off
                self.interval = min(2 * self.interval, self.max_probe_interval)
        if k > 0:
            self.interval, self._zero_run = self.probe_interval, 0
        elif self.k_max > 0 and self._zero_run >= self.interval:
            self._zero_run = 0
            k = self.probe_k or self._probe_size(cost, other_tokens)
            if (
                cost.catch_up_timings(self.drafter) < FEW_CATCH_UPS
                or cost.catch_up_staleness(self.drafter) >= CATCH_UP_RETRY
                or self._worth_catching_up(cost, other_tokens, catch_up, remaining, k, z=OPTIMISM)
            ):
                self._probing, self._probe_seen = True, False
                self.probes += 1
            else:  # even an optimistic probe would not repay its catch-up: back off without it
                self.interval = min(2 * self.interval, self.max_probe_interval)
                k = 0
        else:
            self._zero_run += 1
        self.last_k = k
        return k

    @staticmethod
    def _down_probe_due(cost: CostModel, plain: int) -> bool:
        if not cost.measured(plain):
            return False  # _best_k runs plain first while its cost is only a guess
        every = DOWN_PROBE_EVERY_FEW if cost.timings(plain) < FEW_PLAIN_TIMINGS else DOWN_PROBE_EVERY
        return cost.staleness(plain) >= every

    def _worth_catching_up(
        self, cost: CostModel, other_tokens: int, catch_up: int, remaining: int | None, k: int, z: float
    ) -> bool:
        """Whether drafting k now, after catching the drafter up on catch_up tokens, can pay off:
        the time speculation at this K saves over the remaining tokens exceeds the catch-up."""
        t_catch = cost.catch_up_time(self.drafter, catch_up)
        if t_catch <= 0.0:
            return True
        if remaining is None:
            return True
        plain_rate = _rate(1.0, cost.forward_time(other_tokens + 1, optimistic=True))
        spec_rate = _goodputs(self.tracker.alphas(k, z=z), self._step_times(cost, other_tokens)[:k])[-1]
        if spec_rate <= plain_rate:
            return False
        return remaining * (1.0 / plain_rate - 1.0 / spec_rate) > t_catch

    def _best_k(self, cost: CostModel, other_tokens: int) -> int:
        if self.k_max == 0:
            return 0
        # 1. Expected goodput per K; unmeasured forward sizes priced optimistically.
        plain = other_tokens + 1
        bar = _rate(1.0, cost.forward_time(plain, optimistic=True)) * (1.0 + NEAR_TIE)
        steps = self._step_times(cost, other_tokens)
        mean = _goodputs(self.tracker.alphas(), steps)
        best = max(mean)
        if best >= bar:
            return next(k for k, g in enumerate(mean, start=1) if g >= best * (1.0 - NEAR_TIE))
        # 2. Plain decoding looks best; while its cost is only a guess, run it to measure it.
        if not cost.measured(plain):
            return 0
        # 3. Deviation from a pure argmax: keep the best K while its optimistic alphas still win.
        upper = _goodputs(self.tracker.alphas(z=OPTIMISM), steps)
        k = mean.index(max(mean)) + 1
        return k if upper[k - 1] >= bar else 0

    def record(self, k: int, accepted: int) -> None:
        """Outcome of the round: k drafts verified, the first `accepted` kept (k == 0: ignored)."""
        if k == 0:
            return
        if self.pool is not None:
            self.pool.record(k, accepted)
        if self._probing and not self._probe_seen:
            self._probe_seen = True
            if self.tracker.prob_at_least(accepted) < SURPRISE:
                # the window (and any pooled prior) predates a change: start again from the probe
                self.tracker = AcceptanceTracker(self.k_max, window=self.tracker.window)
        self.tracker.record(k, accepted)

    def _probe_size(self, cost: CostModel, other_tokens: int) -> int:
        """K that is best at the prior alpha (pooled, else the neutral one), at least 1."""
        alphas = [self.tracker.prior_alpha] * self.k_max  # an empty window's alphas
        goodputs = _goodputs(alphas, self._step_times(cost, other_tokens))
        return goodputs.index(max(goodputs)) + 1

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
