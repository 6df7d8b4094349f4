"""Whether a draft is worth a scoring round on a vLLM server: measured prices, measured yields.

On vLLM a scoring round is dear next to a plain token: a request of its own (admission, the
rows since the last cached KV block recomputed through the LM head for their log-probabilities)
and, when the round gets ahead of the plain stream, a new stream to open. The engine's goodput
controller prices K by forward size on a target whose rounds are forwards; here the target
prices each draft itself, by the evidence the drafter gives (``Draft.context``: tokens of
context its lookup matched), from what rounds with that evidence actually gave on this server:

* plain rate: 1 / the median gap between a stream's successive tokens;
* a bucket's round rate: tokens its last rounds emitted / the seconds they took (the round, plus
  opening the next stream when the round got ahead of the old one).

A draft too short to pay even if all of it is accepted (its tokens + 1 take less time plainly
than a round does) is never scored. Otherwise a draft is scored when its bucket's round rate
beats the plain rate, or when the bucket has too few rounds to tell (each bucket is tried), or,
once in ``PROBE_EVERY`` declines, to re-measure (a shared machine's speed drifts).

Per request, ``RouteGate`` asks the same prices whether rounds pay on this server at all: where no
evidence bucket's measured rounds beat plain decoding (``RoundPricer.verdict``), greedy requests
pass through to vLLM's own decoding, relayed untouched (one in ``PROBE_REQUESTS`` still runs rounds,
so a change is seen). A round pays when it emits more tokens than it costs plain tokens: the
break-even round cost is the tokens a scored round emits, logged with the measured cost at each
switch (``average_round``). Pure Python, thread-safe.
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import deque
from typing import Final

__all__ = ["RoundPricer", "RouteGate", "MAX_BUCKET", "MIN_ROUNDS", "PROBE_EVERY", "PROBE_REQUESTS"]

log = logging.getLogger("draftgate.vllm_rounds")

MAX_BUCKET: Final = 8  # contexts of 8 tokens or more share one bucket
MIN_ROUNDS: Final = 4  # rounds a bucket needs before it can be declined
PROBE_EVERY: Final = 32  # a declined bucket scores one draft in this many
WINDOW: Final = 24  # rounds per bucket, gaps per stream, kept
PROBE_REQUESTS: Final = 8  # while rounds do not pay, one greedy request in this many still runs them


class RoundPricer:
    def __init__(self) -> None:
        self._gaps: deque[float] = deque(maxlen=4 * WINDOW)  # seconds between a stream's tokens
        self._opens: deque[float] = deque(maxlen=WINDOW)  # seconds from opening a stream to its first token
        self._rounds: dict[int, deque[tuple[int, float]]] = {}  # bucket -> (tokens, seconds)
        self._round_s: deque[float] = deque(maxlen=WINDOW)  # wall seconds of the last rounds (any bucket)
        self._declined: dict[int, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def bucket(context: int) -> int:
        return max(0, min(int(context), MAX_BUCKET))

    def observe_gap(self, seconds: float) -> None:
        with self._lock:
            self._gaps.append(seconds)

    def observe_open(self, seconds: float) -> None:
        with self._lock:
            self._opens.append(seconds)

    def observe_round(self, context: int, tokens: int, seconds: float, reopened: bool) -> None:
        """A scored draft: the tokens the round emitted, its wall time; ``reopened``: it got ahead."""
        extra = self.reopen_cost() if reopened else 0.0
        with self._lock:
            self._round_s.append(seconds)
            self._rounds.setdefault(self.bucket(context), deque(maxlen=WINDOW)).append((tokens, seconds + extra))

    def step(self) -> float | None:
        """Median seconds per plain token (None before any)."""
        with self._lock:
            return statistics.median(self._gaps) if self._gaps else None

    def reopen_cost(self) -> float:
        """What opening a new stream costs beyond a plain token (0 before it was measured)."""
        with self._lock:
            if not self._opens or not self._gaps:
                return 0.0
            return max(0.0, statistics.median(self._opens) - statistics.median(self._gaps))

    def round_rate(self, context: int) -> float | None:
        """Tokens per second of scored rounds with this evidence (None: too few to tell)."""
        with self._lock:
            obs = self._rounds.get(self.bucket(context))
            if obs is None or len(obs) < MIN_ROUNDS:
                return None
            return sum(t for t, _ in obs) / max(1e-9, sum(s for _, s in obs))

    def breakeven(self) -> float:
        """Tokens a round must emit to cost no more than plain decoding (0 before it can be told)."""
        step = self.step()
        with self._lock:
            if step is None or not self._round_s:
                return 0.0
            round_s = statistics.median(self._round_s)
        return round_s / step

    def average_round(self) -> tuple[float, float] | None:
        """(tokens a scored round emitted, what it cost in plain tokens, reopening a stream included),
        averaged over the buckets' recent rounds (None before any round or plain token). The first is
        the round cost below which rounds pay."""
        step = self.step()
        with self._lock:
            obs = [o for rounds in self._rounds.values() for o in rounds]
        if step is None or not obs:
            return None
        return sum(t for t, _ in obs) / len(obs), sum(s for _, s in obs) / len(obs) / step

    def verdict(self) -> bool | None:
        """Do rounds pay on this server? None: no bucket has rounds enough to tell; else whether any
        measured bucket's rounds emit faster than plain decoding."""
        step = self.step()
        with self._lock:
            buckets = list(self._rounds)
        rates = [r for b in buckets if (r := self.round_rate(b)) is not None]
        if step is None or not rates:
            return None
        return any(rate * step > 1.0 for rate in rates)

    def worth(self, context: int, length: int | None = None) -> bool:
        """Score this draft of ``length`` tokens? (see the module doc)."""
        if length is not None and length + 1 < self.breakeven():
            return False  # even accepted whole, it gives fewer tokens than plain decoding would meanwhile
        rate, step = self.round_rate(context), self.step()
        if rate is None or step is None or rate * step > 1.0:
            return True
        b = self.bucket(context)
        with self._lock:
            n = self._declined[b] = self._declined.get(b, 0) + 1
        return n % PROBE_EVERY == 0

    def snapshot(self) -> dict[str, object]:
        """Prices as measured now (for logs and the closing benchmark note)."""
        step = self.step()
        return {
            "step_ms": round(step * 1e3, 2) if step else None,
            "reopen_ms": round(self.reopen_cost() * 1e3, 2),
            "round_tokens_per_step": {
                b: round(r * step, 3) for b in range(MAX_BUCKET + 1) if step and (r := self.round_rate(b)) is not None
            },
        }


class RouteGate:
    """Per greedy request: the gateway's rounds, or vLLM's own decoding relayed (see the module doc)."""

    def __init__(self, pricer: RoundPricer) -> None:
        self.pricer = pricer
        self.passed = 0  # greedy requests passed through because rounds did not pay
        self._passing = False
        self._declined = 0
        self._lock = threading.Lock()

    def rounds(self) -> bool:
        """Run this request's rounds (True), or pass it through (False)."""
        pay = self.pricer.verdict()
        with self._lock:
            if pay is not False:
                if self._passing:
                    self._passing = False
                    log.info("vllm rounds pay again here (%s): greedy requests run rounds", self._prices())
                return True
            if not self._passing:
                self._passing = True
                log.info(
                    "vllm rounds do not pay here (%s): greedy requests pass through to vLLM's own decoding, "
                    "one in %d still runs rounds",
                    self._prices(),
                    PROBE_REQUESTS,
                )
            self._declined += 1
            if self._declined % PROBE_REQUESTS == 0:
                return True
            self.passed += 1
            return False

    def _prices(self) -> str:
        made, cost = self.pricer.average_round() or (0.0, 0.0)
        return (
            f"a scored round cost {cost:.2f} plain tokens and emitted {made:.2f} on average; "
            "rounds pay where they emit more than they cost"
        )
