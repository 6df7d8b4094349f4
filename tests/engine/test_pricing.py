"""Lookup drafts priced by their evidence (engine.pricing), and the policy's trim that applies it."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from draftgate.drafters.base import Abilities, Draft
from draftgate.engine.controller import EXPLORE, FEW_PLAIN_TIMINGS
from draftgate.engine.costs import CostModel
from draftgate.engine.policy import SpeculationPolicy
from draftgate.engine.pricing import MAX_EVIDENCE, EvidencePricer
from draftgate.engine.round import Round
from draftgate.types import SamplingParams

K_MAX = 8
AVX2 = [1.0, 1.30, 1.55, 1.70, 1.85, 2.0, 2.12, 2.27, 2.41]  # forward(n)/forward(1), AVX2 on Q4 (measured)


def _cost(curve: Sequence[float] = AVX2) -> CostModel:
    cost = CostModel()
    for _ in range(FEW_PLAIN_TIMINGS):
        for n, t in enumerate(curve, start=1):
            cost.observe_forward(n, t)
    return cost


def _teach(p: EvidencePricer, context: int, alpha: float, rounds: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for _ in range(rounds):
        a = 0
        while a < K_MAX and rng.random() < alpha:
            a += 1
        p.record("lookup", context, True, K_MAX, a)


def test_deep_evidence_verifies_the_whole_draft_and_shallow_evidence_none() -> None:
    p, cost = EvidencePricer(K_MAX), _cost()
    _teach(p, MAX_EVIDENCE, 0.95, 100)
    _teach(p, 1, 0.1, 100)
    assert p.choose(cost, "lookup", 12, 8, True, 0, funds=0.0) == (8, False)  # 12 tokens of context: bucket 8
    assert p.choose(cost, "lookup", 1, 8, True, 0, funds=0.0) == (0, False)


def test_where_rows_are_cheap_even_shallow_evidence_pays() -> None:
    """alpha 0.1 at one token of context: a loss where a row costs 30% of a pass, a gain at 5%."""
    vnni = [1.0, 1.05, 1.10, 1.15, 1.23, 1.23, 1.38, 1.57, 1.73]
    p = EvidencePricer(K_MAX)
    _teach(p, 1, 0.3, 100)
    assert p.choose(_cost(AVX2), "lookup", 1, 8, True, 0, funds=0.0)[0] == 0
    assert p.choose(_cost(vnni), "lookup", 1, 8, True, 0, funds=0.0)[0] >= 1


def test_buckets_are_kept_apart_by_source_evidence_and_sampling() -> None:
    p = EvidencePricer(K_MAX)
    _teach(p, 3, 0.9, 50)
    assert p.tracker("lookup", 3, True).alphas(1)[0] > 0.8
    assert p.tracker("lookup", 3, False).alphas(1)[0] == 0.5  # sampled requests: their own estimate
    assert p.tracker("other", 3, True).alphas(1)[0] == 0.5
    assert p.tracker("lookup", 2, True).alphas(1)[0] == 0.5
    assert p.tracker("lookup", 40, True) is p.tracker("lookup", MAX_EVIDENCE, True)


def test_a_bucket_that_could_still_pay_is_probed_with_what_plain_rounds_paid_for() -> None:
    p, cost = EvidencePricer(K_MAX), _cost()
    for a in (1, 0, 0, 0, 0, 0):  # six rounds, one first draft accepted: its mean loses, its optimistic estimate wins
        p.record("lookup", 2, True, K_MAX, a)
    assert p.choose(cost, "lookup", 2, 8, True, 0, funds=0.0) == (0, False)  # nothing paid for yet
    k, probe = p.choose(cost, "lookup", 2, 8, True, 0, funds=EXPLORE * 20 * AVX2[0])  # 20 plain rounds
    assert probe and k == 1  # the longest probe those rounds pay for: one draft (a second row: 0.3 of a pass)
    assert p.probe_cost(cost, "lookup", 0, k) == pytest.approx(AVX2[1] - AVX2[0], rel=0.05)


def test_a_bucket_known_to_lose_is_not_probed() -> None:
    p, cost = EvidencePricer(K_MAX), _cost()
    _teach(p, 1, 0.05, 128)
    assert p.choose(cost, "lookup", 1, 8, True, 0, funds=100.0) == (0, False)


# ------------------------------------------------------------------ the policy's trim


@dataclass
class _Seq:
    seq_id: int
    history: list[int] = field(default_factory=lambda: list(range(40)))
    output: list[int] = field(default_factory=list)
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=100))
    rand: object = None

    def append(self, tokens: Sequence[int]) -> list[int]:
        raise AssertionError("not in these tests")


class _Lookup:
    name = "lookup"
    sampled_q = False
    abilities = Abilities(lookup=True)

    def propose(self, requests):  # noqa: ANN001, ANN201
        raise AssertionError("the tests draft by hand")

    def observe(self, *a: object) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


def _planned(policy: SpeculationPolicy, context: int, draft_len: int = 8) -> Round:
    s = _Seq(1)
    policy.open(1, s.params)
    r = Round(s, K_MAX)
    policy.plan([r])
    assert r.lookup and r.k == K_MAX  # a lookup is asked for every draft it has
    r.draft = Draft(list(range(100, 100 + draft_len)), context=context)
    policy.trim([r])
    return r


def test_trim_cuts_each_lookup_draft_to_what_its_evidence_pays_for() -> None:
    policy = SpeculationPolicy(_Lookup(), None, K_MAX, cost=_cost())
    _teach(policy.evidence, 8, 0.95, 100)
    _teach(policy.evidence, 1, 0.05, 128)
    assert len(_planned(policy, 9).draft.token_ids) == 8
    r = _planned(policy, 1)
    assert r.draft.token_ids == [] and r.draft.context == 1  # dropped: a plain round


def test_a_fixed_k_is_never_trimmed() -> None:
    policy = SpeculationPolicy(_Lookup(), 8, K_MAX, cost=_cost())
    _teach(policy.evidence, 1, 0.05, 128)
    assert len(_planned(policy, 1).draft.token_ids) == 8


def test_a_target_that_prices_drafts_itself_decides_instead() -> None:
    class Pricer:
        def __init__(self) -> None:
            self.asked: list[tuple[int, int]] = []

        def worth(self, context: int, length: int) -> bool:
            self.asked.append((context, length))
            return context >= 4

    pricer = Pricer()
    policy = SpeculationPolicy(_Lookup(), None, K_MAX, pricer=pricer, cost=_cost())
    _teach(policy.evidence, 1, 0.99, 100)  # the evidence pricer would keep it; the target's does not
    assert _planned(policy, 1).draft.token_ids == []
    assert len(_planned(policy, 6, draft_len=5).draft.token_ids) == 5
    assert pricer.asked == [(1, 8), (6, 5)]
