"""Shadow mode: score a route's drafter against the tokens its target actually produced.

Teacher-forced replay of speculation over a finished request: starting at the
first output token, the drafter proposes up to k tokens from the true history
prefix; the matching prefix of the draft is what a greedy verifier would have
accepted (the target produced exactly these tokens); the round emits accepted +
1 tokens and the next round starts after them, as it would have live. Exact for
greedy requests; for sampled ones it is the acceptance of one-hot drafts
against the realized tokens, an estimate.

Predicted speedup uses the engine's measured ``CostModel``: expected tokens per
round over the round's cost relative to a plain round,
``mean_accepted_length * t_fwd(1) / (t_fwd(1 + mean_drafted) + t_draft per round)``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from draftgate.drafters.base import Drafter, DraftRequest
from draftgate.engine import CostModel
from draftgate.types import SamplingParams, SpecStats

__all__ = ["ShadowTotals", "score_sequence", "predicted_speedup"]

# Shadow sequences get ids far from the engine's, so a drafter's per-sequence state never collides.
_SHADOW_IDS = itertools.count(1 << 48)


@dataclass
class ShadowTotals:
    """A route's shadow replays: how many requests, and their speculation counters."""

    requests: int = 0
    stats: SpecStats = field(default_factory=SpecStats)

    def add(self, s: SpecStats) -> None:
        self.requests += 1
        self.stats.merge(s)

    @property
    def acceptance_rate(self) -> float:
        return self.stats.acceptance_rate

    @property
    def mean_accepted_length(self) -> float:
        return self.stats.mean_accepted_length

    @property
    def mean_drafted(self) -> float:
        return self.stats.draft_tokens / self.stats.rounds if self.stats.rounds else 0.0


def score_sequence(
    drafter: Drafter, tokens: Sequence[int], prompt_len: int, k: int, params: SamplingParams | None = None
) -> SpecStats:
    """Replay speculation with ``drafter`` over ``tokens`` (prompt + output), K fixed at ``k``."""
    if not 1 <= prompt_len <= len(tokens):
        raise ValueError(f"prompt_len must be in [1, {len(tokens)}], got {prompt_len}")
    params = params or SamplingParams(temperature=0.0)
    seq_id = next(_SHADOW_IDS)
    out = SpecStats(drafter=drafter.name)
    i = prompt_len  # the next position to produce
    try:
        while i < len(tokens):
            k_i = min(k, len(tokens) - i - 1)  # the last token is always the target's own
            t0 = time.perf_counter()
            draft = drafter.propose([DraftRequest(seq_id, tokens[:i], k_i, params)])[0] if k_i > 0 else None
            out.draft_time_s += time.perf_counter() - t0
            ids = list(draft.token_ids[:k_i]) if draft is not None else []
            a = 0
            while a < len(ids) and ids[a] == tokens[i + a]:
                a += 1
            out.record_round(len(ids), a, a + 1)
            if ids:
                drafter.observe(seq_id, tokens[: i + a + 1], len(ids), a)
            i += a + 1
    finally:
        drafter.release(seq_id)
    return out


def predicted_speedup(totals: ShadowTotals, cost: CostModel) -> float:
    """Expected tokens per round / relative cost of a round (1.0 = as fast as plain decoding).

    Forward times come from the engine's cost model; the draft time per round is what
    the shadow replay itself measured (the engine never drafts on a route that is off).
    """
    st = totals.stats
    if not st.rounds:
        return 0.0
    plain = cost.forward_time(1)
    spec = cost.forward_time(max(1, round(1 + totals.mean_drafted))) + st.draft_time_s / st.rounds
    return totals.mean_accepted_length * plain / spec if spec > 0 else 0.0
