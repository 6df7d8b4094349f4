"""Acceptance estimates: per position of a draft, for one request (``AcceptanceTracker``) and pooled
over an engine's requests (``AcceptancePool``).

alpha_i = P(draft i accepted | drafts 1..i-1 accepted). A round that drafted k tokens and
accepted a of them tried positions 1..min(a+1, k) and accepted 1..a. Pure Python.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["AcceptancePool", "AcceptanceTracker", "POOL_MIN_ROUNDS"]

POOL_MIN_ROUNDS = 8.0  # a pool this thin is not yet a prior


class AcceptanceTracker:
    """Per-position conditional acceptance of one request over its last `window` rounds.

    A round that drafted k tokens and accepted a of them tried positions
    1..min(a+1, k) and accepted 1..a. The estimate is
    alpha_i = (accepted_i + w * m_i) / (tried_i + w) with w = prior_weight and
    prior mean m_1 = prior_alpha, m_i = alpha_{i-1}: a position the request
    rarely reaches inherits the one before it rather than a fixed guess.
    """

    def __init__(self, k_max: int, window: int = 64, prior_alpha: float = 0.5, prior_weight: float = 2.0) -> None:
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

    def alphas(self, k: int | None = None, z: float = 0.0, prior: list[float] | None = None) -> list[float]:
        """alpha_1..alpha_k (default k_max); z > 0 adds z posterior sds (capped at 1).

        ``prior``: each position's prior mean (a pooled estimate this request's rounds refine, weighted
        ``prior_weight``), instead of prior_alpha chained from the position before."""
        k = self.k_max if k is None else k
        if not 0 <= k <= self.k_max:
            raise ValueError(f"k must be in [0, {self.k_max}], got {k!r}")
        out, m, w = [], self.prior_alpha, self.prior_weight
        for i in range(k):
            n = self._tried[i] + w
            m = (self._acc[i] + w * (m if prior is None else prior[i])) / n  # the mean, and the next prior
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
