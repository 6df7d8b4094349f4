"""Shadow replay: teacher-forced scoring of a drafter against known token sequences."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from draftgate.drafters import Draft, DraftRequest, NgramDrafter
from draftgate.engine import CostModel
from draftgate.server.ops.shadow import ShadowTotals, predicted_speedup, score_sequence
from draftgate.types import SamplingParams, SpecStats


def test_repeated_text_predicts_high_acceptance() -> None:
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    tokens = prompt + prompt * 8  # the output copies the prompt over and over
    s = score_sequence(NgramDrafter(), tokens, len(prompt), k=4)
    assert s.emitted_tokens == len(tokens) - len(prompt)
    assert s.acceptance_rate > 0.9
    assert s.mean_accepted_length > 4.0  # close to k + 1 = 5 tokens per round


def test_random_text_predicts_near_zero_acceptance() -> None:
    rng = random.Random(0)
    tokens = [rng.randrange(1000, 100000) for _ in range(200)]  # no repeats to look up
    s = score_sequence(NgramDrafter(), tokens, 20, k=4)
    assert s.accepted_tokens == 0
    assert s.rounds == s.emitted_tokens == 180  # plain decoding: one token per round


class _Recording(NgramDrafter):
    """An n-gram drafter that notes which sequences it drafted for and the most it held at once."""

    def __init__(self) -> None:
        super().__init__()
        self.proposed: set[int] = set()
        self.held_during_replay = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = super().propose(requests)
        self.proposed.update(r.seq_id for r in requests)
        self.held_during_replay = max(self.held_during_replay, self.num_sequences)
        return out


def test_every_output_token_is_accounted_and_drafter_state_released() -> None:
    d = _Recording()
    d.propose([DraftRequest(0, [9, 8, 9], 2, SamplingParams())])  # a live request the drafter already holds
    assert d.num_sequences == 1
    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2, 3]
    s = score_sequence(d, tokens, 3, k=3)
    assert s.emitted_tokens == 9 and s.accepted_tokens <= s.draft_tokens
    assert len(d.proposed - {0}) == 1  # the replay drafted under one id of its own ...
    assert d.held_during_replay == 2  # ... held beside the live request while it ran ...
    assert d.num_sequences == 1  # ... and released it at the end, leaving only the live request


def test_prompt_len_is_checked() -> None:
    with pytest.raises(ValueError):
        score_sequence(NgramDrafter(), [1, 2], 3, k=2)


def test_predicted_speedup_from_the_cost_model() -> None:
    cost = CostModel()
    for _ in range(3):
        cost.observe_forward(1, 0.010)
        cost.observe_forward(5, 0.012)
    t = ShadowTotals(1, SpecStats(rounds=10, draft_tokens=40, accepted_tokens=36, emitted_tokens=46))
    assert predicted_speedup(t, cost) == pytest.approx(4.6 * 0.010 / 0.012, rel=1e-6)
    plain = ShadowTotals(1, SpecStats(rounds=10, emitted_tokens=10))
    assert predicted_speedup(plain, cost) == pytest.approx(1.0)
    assert predicted_speedup(ShadowTotals(), cost) == 0.0
