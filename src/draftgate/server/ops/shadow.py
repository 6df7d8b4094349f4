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
from dataclasses import dataclass

from draftgate.drafters.base import Drafter, DraftRequest
from draftgate.engine import CostModel
from draftgate.types import SamplingParams

__all__ = ["ShadowScore", "ShadowTotals", "score_sequence", "predicted_speedup"]

# Shadow sequences get ids far from the engine's, so a drafter's per-sequence state never collides.
_SHADOW_IDS = itertools.count(1 << 48)


@dataclass(frozen=True)
class ShadowScore:
    rounds: int
    drafted: int
    accepted: int
    emitted: int
    draft_s: float = 0.0  # seconds spent in the drafter


@dataclass
class ShadowTotals:
    requests: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_s: float = 0.0

    def add(self, s: ShadowScore) -> None:
        self.requests += 1
        self.rounds += s.rounds
        self.drafted += s.drafted
        self.accepted += s.accepted
        self.emitted += s.emitted
        self.draft_s += s.draft_s

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.emitted / self.rounds if self.rounds else 0.0

    @property
    def mean_drafted(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0


def score_sequence(
    drafter: Drafter, tokens: Sequence[int], prompt_len: int, k: int, params: SamplingParams | None = None
) -> ShadowScore:
    """Replay speculation with ``drafter`` over ``tokens`` (prompt + output), K fixed at ``k``."""
    if not 1 <= prompt_len <= len(tokens):
        raise ValueError(f"prompt_len must be in [1, {len(tokens)}], got {prompt_len}")
    params = params or SamplingParams(temperature=0.0)
    seq_id = next(_SHADOW_IDS)
    rounds = drafted = accepted = emitted = 0
    draft_s = 0.0
    i = prompt_len  # the next position to produce
    try:
        while i < len(tokens):
            k_i = min(k, len(tokens) - i - 1)  # the last token is always the target's own
            t0 = time.perf_counter()
            draft = drafter.propose([DraftRequest(seq_id, tokens[:i], k_i, params)])[0] if k_i > 0 else None
            draft_s += time.perf_counter() - t0
            ids = list(draft.token_ids[:k_i]) if draft is not None else []
            a = 0
            while a < len(ids) and ids[a] == tokens[i + a]:
                a += 1
            rounds, drafted, accepted, emitted = rounds + 1, drafted + len(ids), accepted + a, emitted + a + 1
            if ids:
                drafter.observe(seq_id, tokens[: i + a + 1], len(ids), a)
            i += a + 1
    finally:
        drafter.release(seq_id)
    return ShadowScore(rounds, drafted, accepted, emitted, draft_s)


def predicted_speedup(totals: ShadowTotals, cost: CostModel) -> float:
    """Expected tokens per round / relative cost of a round (1.0 = as fast as plain decoding).

    Forward times come from the engine's cost model; the draft time per round is what
    the shadow replay itself measured (the engine never drafts on a route that is off).
    """
    if not totals.rounds:
        return 0.0
    plain = cost.forward_time(1)
    spec = cost.forward_time(max(1, round(1 + totals.mean_drafted))) + totals.draft_s / totals.rounds
    return totals.mean_accepted_length * plain / spec if spec > 0 else 0.0
