"""Measured costs of target forwards and draft calls: the prices the goodput controller weighs.

Costs are *measured, never configured*: the engine times every target forward
and draft call into one shared `CostModel` (only ratios matter, so the
cold-start prior is in arbitrary units). Costs need not be monotone in K (on
AVX2 CPUs 2-3 row forwards cost more than 5 row ones); sizes never measured
are priced optimistically so the controller runs each once and learns it.
Pure Python, no torch, no I/O.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort
from collections import deque
from typing import Final

__all__ = ["CostModel"]

EXACT_BUCKETS: Final = 64  # forward sizes 1..64 each get a cost bucket
COARSE_PER_DOUBLING: Final = 4  # above that, 4 geometric buckets per doubling of tokens
PRIOR_SLOPE: Final = 0.25  # cold-start prior: forward_time(n) = 1 + 0.25 * (n - 1)
# A forward size not timed for STALE_AFTER forwards whose next timing is more than STALE_SHIFT off
# its window's median starts its window again from that timing: a shared machine's speed drifts
# (one-token forwards can nearly double within minutes), so timings from before a long run of other
# sizes can price the machine as it was; plain decoding priced from a slow minute, for instance,
# makes every round draft even on a request whose drafts are never accepted. With a fresh window
# plain has few timings, so the controller's down-probes (engine.controller: DOWN_PROBE_EVERY_FEW,
# FEW_PLAIN_TIMINGS) come often until it has enough again; a timing that agrees with the stale
# median joins it as usual (no extra down-probes where the machine has not moved).
STALE_AFTER: Final = 64
STALE_SHIFT: Final = 0.2
# A probe the controller would refuse for its catch-up price (engine.controller: FEW_CATCH_UPS)
# goes ahead once that price is older than this many forwards (of any request), a retry at most
# this often engine-wide: otherwise a price taken while the machine was slow would refuse every
# probe for good, since only a probe's catch-up re-times it, and the drafter would never draft
# again. A retry whose timing is more than STALE_SHIFT off the window's price starts the window
# again from it (then FEW_CATCH_UPS lets the next probes measure), as forwards do.
CATCH_UP_RETRY: Final = 512
# Drafted rounds over which a drafter's mean extra (draft tree) rows are taken.
BRANCH_WINDOW: Final = 64


def _prior(n: float) -> float:
    return 1.0 + PRIOR_SLOPE * (n - 1)


def _bucket(n: int) -> int:
    if n <= EXACT_BUCKETS:
        return n
    j = max(1, round(COARSE_PER_DOUBLING * math.log2(n / EXACT_BUCKETS)))
    return round(EXACT_BUCKETS * 2 ** (j / COARSE_PER_DOUBLING))


def _check(num_tokens: int, low: int, seconds: float) -> None:
    if num_tokens < low:
        raise ValueError(f"num_tokens must be >= {low}, got {num_tokens!r}")
    if not (seconds >= 0.0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")


class CostModel:
    """Measured costs of target forwards and draft calls, shared by one engine.

    Forward time: the median of the last `window` observations per token-count
    bucket (exact for 1..64 tokens, then geometric buckets, within which time is
    proportional to tokens); a median, not a mean, because on a shared machine
    one slow step must not flip the choice between K = 0 and K = 1, whose costs
    often differ by only a few percent. Unmeasured sizes are interpolated
    between measured ones; below them the smallest is scaled by the prior's
    shape, above them a fitted line a + b*n (b >= 0) extends the largest.
    optimistic=True prices an unmeasured size like the cheapest measured
    smaller one (proportionally less below all): a longer forward may cost
    less, and only running it tells. Draft time per drafter and k: the median
    of the last `window` calls that drafted k; other k from a line (overhead +
    per-token * k) through those medians. Medians again: one call that also
    prefilled the drafter (auto switching to its model draft) must not price
    drafting out, since a priced-out drafter is never measured again.
    """

    def __init__(self, window: int = 15) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self._obs: dict[int, deque[float]] = {}  # bucket -> last `window` seconds (at the bucket's size)
        self._window = window
        self._fwd: dict[int, float] = {}  # bucket -> median of _obs[bucket]
        self._keys: list[int] = []  # measured buckets, sorted
        self._prefix_min: list[float] | None = None  # [i]: min time of keys[:i+1]; lazy
        self._slope: float | None = None  # fitted b; lazy
        self._draft: dict[str, dict[int, deque[float]]] = {}  # drafter -> k -> last `window` seconds
        self._draft_med: dict[str, dict[int, float]] = {}  # drafter -> k -> median of _draft[drafter][k]
        self._draft_fit: dict[str, tuple[float, float]] = {}  # drafter -> (overhead, per-token); lazy
        self._forwards = 0  # forward observations so far
        self._last_seen: dict[int, int] = {}  # bucket -> value of _forwards when it was last observed
        self._catch_up: dict[str, deque[tuple[float, int]]] = {}  # drafter -> last `window` (seconds a token, tokens)
        self._catch_up_seen: dict[str, int] = {}  # drafter -> value of _forwards at its last catch-up timing
        self._branch: dict[str, deque[int]] = {}  # drafter -> extra rows of its last BRANCH_WINDOW drafted rounds
        self._branch_mean: dict[str, float] = {}  # drafter -> mean of _branch[drafter]

    def observe_forward(self, num_tokens: int, seconds: float) -> None:
        """One target forward over num_tokens tokens in total (all sequences) took seconds."""
        _check(num_tokens, 1, seconds)
        key = _bucket(num_tokens)
        t = seconds * key / num_tokens  # exact buckets: key == num_tokens
        obs = self._obs.get(key)
        if obs is None:
            insort(self._keys, key)
            obs = self._obs[key] = deque(maxlen=self._window)
        elif self._forwards - self._last_seen[key] >= STALE_AFTER and abs(t / self._fwd[key] - 1.0) > STALE_SHIFT:
            obs.clear()  # the machine has moved since this size was last timed: start it again
        obs.append(t)
        self._fwd[key] = statistics.median(obs)
        self._prefix_min = self._slope = None
        self._forwards += 1
        self._last_seen[key] = self._forwards

    def measured(self, n: int) -> bool:
        """Whether a forward of n tokens (its bucket) has been timed."""
        return _bucket(n) in self._fwd

    def timings(self, n: int) -> int:
        """How many timings the window holds for forwards of n tokens (its bucket)."""
        obs = self._obs.get(_bucket(n))
        return len(obs) if obs is not None else 0

    def staleness(self, n: int) -> int:
        """Forwards observed since one of n tokens (its bucket) was last timed (all of them if never)."""
        return self._forwards - self._last_seen.get(_bucket(n), 0)

    def forward_time(self, n: int, optimistic: bool = False) -> float:
        """Estimated seconds of a forward over n tokens (prior units before any observation)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n!r}")
        keys = self._keys
        if not keys:
            return _prior(n)
        key = _bucket(n)
        t = self._fwd.get(key)
        if t is not None:
            return t * n / key
        i = bisect_left(keys, n)
        if i == 0:  # below every measurement
            lo = keys[0]
            return self._fwd[lo] * (n / lo if optimistic else _prior(n) / _prior(lo))
        if optimistic:
            if self._prefix_min is None:
                self._prefix_min, low = [], math.inf
                for k in keys:
                    low = min(low, self._fwd[k])
                    self._prefix_min.append(low)
            return self._prefix_min[i - 1]
        if i == len(keys):  # above every measurement
            return self._fwd[keys[-1]] + self._fitted_slope() * (n - keys[-1])
        lo, hi = keys[i - 1], keys[i]
        t_lo, t_hi = self._fwd[lo], self._fwd[hi]
        return t_lo + (t_hi - t_lo) * (n - lo) / (hi - lo)

    def _fitted_slope(self) -> float:
        if self._slope is None:
            xs = self._keys
            ys = [self._fwd[x] for x in xs]
            if len(xs) == 1:
                self._slope = ys[0] * PRIOR_SLOPE / _prior(xs[0])
            else:
                mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
                cov = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
                self._slope = max(0.0, cov / sum((x - mx) ** 2 for x in xs))
        return self._slope

    def observe_draft(self, drafter: str, num_tokens: int, seconds: float) -> None:
        """One call of drafter whose longest draft was num_tokens tokens took seconds."""
        _check(num_tokens, 0, seconds)
        per_k = self._draft.setdefault(drafter, {})
        obs = per_k.get(num_tokens)
        if obs is None:
            obs = per_k[num_tokens] = deque(maxlen=self._window)
        obs.append(seconds)
        self._draft_med.setdefault(drafter, {})[num_tokens] = statistics.median(obs)
        self._draft_fit.pop(drafter, None)

    def observe_catch_up(self, drafter: str, num_tokens: int, seconds: float) -> None:
        """A draft call also brought the drafter up to date on num_tokens tokens it had not seen.

        ``seconds`` is what the call took beyond its steady-state price (``draft_time``). A
        lookup drafter indexes a token in microseconds; a model drafter runs its forward over
        them (a llama.cpp Q4 draft model: ~10 ms a token).
        """
        _check(num_tokens, 1, max(0.0, seconds))
        per_token = max(0.0, seconds) / num_tokens
        obs = self._catch_up.setdefault(drafter, deque(maxlen=self._window))
        if obs and self.catch_up_staleness(drafter) >= CATCH_UP_RETRY:
            price = self.catch_up_time(drafter, 1)
            if abs(per_token - price) > STALE_SHIFT * price:
                obs.clear()  # a price from another time of the machine: start again from this timing
        obs.append((per_token, num_tokens))
        self._catch_up_seen[drafter] = self._forwards

    def catch_up_staleness(self, drafter: str) -> int:
        """Forwards observed since drafter's catch-up was last timed (all of them if never)."""
        return self._forwards - self._catch_up_seen.get(drafter, 0)

    def catch_up_timings(self, drafter: str) -> int:
        """How many catch-up timings of drafter the window holds."""
        obs = self._catch_up.get(drafter)
        return len(obs) if obs is not None else 0

    def catch_up_time(self, drafter: str, num_tokens: int) -> float:
        """Estimated seconds to bring drafter up to date on num_tokens tokens (0 before any observation).

        The per-token price is the window's median weighted by tokens: a call that caught up on 1-2
        tokens (after a plain round) is mostly timing noise over a tiny denominator (it can read 100
        times a prompt's per-token price), and must not price a 50-token prompt's catch-up; a median
        still ignores one slow call.
        """
        obs = self._catch_up.get(drafter)
        if not obs or num_tokens <= 0:
            return 0.0
        ranked = sorted(obs)
        half, run = sum(n for _, n in ranked) / 2.0, 0
        for i, (t, n) in enumerate(ranked):
            run += n
            if run > half:
                return t * num_tokens
            if run == half:  # an even split: between this price and the next
                return (t + ranked[i + 1][0]) / 2.0 * num_tokens
        raise AssertionError("unreachable: the weights sum to more than half")

    def observe_branch(self, drafter: str, extra_rows: int) -> None:
        """One drafted round of drafter put extra_rows rows in the forward beyond its K + 1 (draft tree nodes)."""
        if extra_rows < 0:
            raise ValueError(f"extra_rows must be >= 0, got {extra_rows!r}")
        obs = self._branch.get(drafter)
        if obs is None:
            obs = self._branch[drafter] = deque(maxlen=BRANCH_WINDOW)
        obs.append(extra_rows)
        self._branch_mean[drafter] = sum(obs) / len(obs)

    def branch_rows(self, drafter: str) -> float:
        """Mean extra rows a drafted round of drafter adds to the forward (0 before any observation)."""
        return self._branch_mean.get(drafter, 0.0)

    def round_forward_time(self, drafter: str, n: int) -> float:
        """Expected seconds of the forward of a round whose sequences put n rows in it, one of them
        drafting with drafter: ``forward_time(n)`` (unmeasured sizes optimistic) plus the drafter's
        mean extra rows at the measured slope from n to n + 2 (a draft tree's nodes). Rounds
        with a tree are timed at their true size and their accepted tokens count in the source's
        acceptance, so pricing K by its K + 1 rows alone would understate what a round costs where
        rows are dear (on some CPUs 4 rows cost 1.28x one)."""
        t = self.forward_time(n, optimistic=True)
        extra = self.branch_rows(drafter)
        if extra <= 0.0:
            return t
        per_row = max(0.0, self.forward_time(n + 2) - self.forward_time(n)) / 2.0
        return t + extra * per_row

    def draft_priced(self, drafter: str) -> bool:
        """Whether a steady-state call of drafter has been timed (``draft_time`` is a measurement, not 0)."""
        return bool(self._draft.get(drafter))

    def draft_time(self, drafter: str, k: int) -> float:
        """Estimated seconds of a draft call whose longest draft is k tokens; 0 for k == 0 or before any call."""
        per_k = self._draft.get(drafter)
        if k <= 0 or not per_k:
            return 0.0
        med = self._draft_med[drafter].get(k)
        if med is not None:
            return med
        fit = self._draft_fit.get(drafter)
        if fit is None:
            fit = self._draft_fit[drafter] = self._fit_draft(per_k)
        overhead, slope = fit
        return overhead + slope * k

    @staticmethod
    def _fit_draft(per_k: dict[int, deque[float]]) -> tuple[float, float]:
        """(overhead, per-token) through the per-size medians; one size: per-token (safe for models)."""
        pts = [(float(n), statistics.median(d)) for n, d in per_k.items()]
        if len(pts) == 1:
            n, t = pts[0]
            return (0.0, t / n) if n >= 1 else (t, 0.0)
        mx = sum(n for n, _ in pts) / len(pts)
        mt = sum(t for _, t in pts) / len(pts)
        slope = sum((n - mx) * (t - mt) for n, t in pts) / sum((n - mx) ** 2 for n, _ in pts)
        if slope < 0.0:
            return mt, 0.0
        overhead = mt - slope * mx
        if overhead < 0.0:
            return 0.0, mt / mx
        return overhead, slope
