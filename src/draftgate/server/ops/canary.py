"""Canary with auto-rollback: compare a route's speculative arm against its plain arm.

Each finished request of a canaried route is one sample of its arm: tokens per
second (completion tokens over end-to-end time) and ITL (decode seconds per
token after the first delivery). Over a sliding window of the last ``window``
samples per arm, the speculative arm *loses* when its median tokens/s is below
the plain arm's by more than ``margin``, or its median ITL is above by more than
``margin``, once both arms hold ``min_samples``. Medians, so one stalled request
does not decide. Pure logic: no clocks, no I/O; the caller measures.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from statistics import median

__all__ = ["Arm", "CanaryConfig", "CanaryMonitor", "Sample"]


class Arm(str, enum.Enum):
    SPECULATIVE = "speculative"
    PLAIN = "plain"


@dataclass(frozen=True)
class CanaryConfig:
    margin: float = 0.05  # the speculative arm may be this much worse (a fraction) before rollback
    min_samples: int = 20  # per arm, before any verdict
    window: int = 100  # the last this many samples per arm are compared

    def validate(self) -> CanaryConfig:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"canary margin must be in [0, 1), got {self.margin!r}")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(f"canary min_samples must be in [1, window={self.window}], got {self.min_samples!r}")
        return self


@dataclass(frozen=True)
class Sample:
    tokens_per_s: float
    itl_s: float  # seconds per token after the first delivery (0 when there was one delivery)


class CanaryMonitor:
    def __init__(self, config: CanaryConfig | None = None) -> None:
        self.config = (config or CanaryConfig()).validate()
        self._arms: dict[Arm, deque[Sample]] = {a: deque(maxlen=self.config.window) for a in Arm}

    def record(self, arm: Arm, sample: Sample) -> str | None:
        """Add one finished request; the reason to roll back, when the speculative arm now loses."""
        self._arms[arm].append(sample)
        return self.verdict()

    def count(self, arm: Arm) -> int:
        return len(self._arms[arm])

    def reset(self) -> None:
        for d in self._arms.values():
            d.clear()

    def summary(self) -> dict[str, dict[str, float | int]]:
        out: dict[str, dict[str, float | int]] = {}
        for arm, d in self._arms.items():
            out[arm.value] = {
                "samples": len(d),
                "median_tokens_per_s": median(s.tokens_per_s for s in d) if d else 0.0,
                "median_itl_s": median(s.itl_s for s in d) if d else 0.0,
            }
        return out

    def verdict(self) -> str | None:
        spec, plain = self._arms[Arm.SPECULATIVE], self._arms[Arm.PLAIN]
        n = self.config.min_samples
        if len(spec) < n or len(plain) < n:
            return None
        m = self.config.margin
        s_tps, p_tps = median(s.tokens_per_s for s in spec), median(s.tokens_per_s for s in plain)
        if s_tps < p_tps * (1.0 - m):
            return (
                f"speculative tokens/s {s_tps:.1f} < plain {p_tps:.1f} by {1 - s_tps / p_tps:.0%} "
                f"(margin {m:.0%}, {len(spec)}/{len(plain)} samples)"
            )
        s_itl, p_itl = median(s.itl_s for s in spec), median(s.itl_s for s in plain)
        if p_itl > 0.0 and s_itl > p_itl * (1.0 + m):
            return (
                f"speculative ITL {s_itl * 1e3:.2f} ms > plain {p_itl * 1e3:.2f} ms by {s_itl / p_itl - 1:.0%} "
                f"(margin {m:.0%}, {len(spec)}/{len(plain)} samples)"
            )
        return None
