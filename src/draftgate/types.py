"""Small value types shared by every layer (the vocabulary of the project).

``SamplingParams`` is frozen: it crosses every boundary unchanged. ``SpecStats`` is the one
mutable type here: an accumulator, written only by the engine that owns it (under its lock)
and handed to sinks (responses, metrics, bench reports) that only read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["SamplingParams", "SpecStats"]

# Upper bounds that keep a single request from taking the server down.
MAX_NEW_TOKENS_LIMIT = 1 << 16
MAX_TOP_K = 1 << 20


@dataclass(frozen=True)
class SamplingParams:
    """How one request turns target logits into tokens.

    temperature == 0 means greedy (argmax); top_k == 0 and top_p == 1.0 disable
    those filters. The same transforms are applied to p (target) and q (draft).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    cache_salt: str | None = None  # a vLLM target's prefix-cache salt for this request (tenancy)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> SamplingParams:
        """Raise ValueError with a user-facing message if any field is out of range."""
        t = self.temperature
        if not isinstance(t, (int, float)) or math.isnan(t) or t < 0 or t > 100:
            raise ValueError(f"temperature must be in [0, 100], got {t!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0 or self.top_k > MAX_TOP_K:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or math.isnan(p) or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {p!r}")
        n = self.max_new_tokens
        if not isinstance(n, int) or n < 1 or n > MAX_NEW_TOKENS_LIMIT:
            raise ValueError(f"max_new_tokens must be in [1, {MAX_NEW_TOKENS_LIMIT}], got {n!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        return self


@dataclass
class SpecStats:
    """Speculation counters of one request (or an aggregate of many).

    A *round* is one target forward that verifies k >= 0 draft tokens. Every round
    emits accepted + 1 tokens (the +1 is the recovered or bonus token), so
    mean_accepted_length counts that token and plain decoding has 1.0.
    """

    drafter: str = "none"
    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    approximate: bool = False  # some round was verified by an approximation (openai+http sampling)
    sampled_rounds: int = 0  # rounds whose drafts came with a sampled q (verified by rejection sampling)
    target_decoded: bool = False  # the target server's own decoding, nothing drafted (vllm+http rounds' relay)
    fallback_rounds: int = 0  # rounds whose drafts the target could not score: decoded plainly instead

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted_tokens / self.rounds if self.rounds else 0.0

    def record_round(self, k: int, accepted: int, emitted: int) -> None:
        self.rounds += 1
        self.draft_tokens += k
        self.accepted_tokens += accepted
        self.emitted_tokens += emitted
        if len(self.accepted_per_pos) < accepted:
            self.accepted_per_pos.extend([0] * (accepted - len(self.accepted_per_pos)))
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def merge(self, other: SpecStats) -> None:
        self.rounds += other.rounds
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        self.emitted_tokens += other.emitted_tokens
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        self.accepted_per_pos.extend([0] * (n - len(self.accepted_per_pos)))
        for i, v in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[i] += v
        self.draft_time_s += other.draft_time_s
        self.verify_time_s += other.verify_time_s
        self.approximate |= other.approximate
        self.sampled_rounds += other.sampled_rounds
        self.target_decoded |= other.target_decoded
        self.fallback_rounds += other.fallback_rounds

    def to_json(self) -> dict[str, object]:
        return {
            "drafter": self.drafter,
            "rounds": self.rounds,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
        }
