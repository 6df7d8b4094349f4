"""The speculation policy inside the engine: K sees the batch, draft calls are priced in steady
state only and per request, and each draft source keeps its own acceptance."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from engine_support import (
    TINY_PROMPTS,
    TINY_SETTINGS,
    FrozenCost,
    OracleDrafter,
    assert_no_leaks,
    engine_with,
    run_batch,
    running,
)

from draftgate.drafters.base import Abilities, Draft, DraftRequest, Source
from draftgate.engine import DrafterKind, Engine
from draftgate.engine.controller import GoodputController
from draftgate.types import SamplingParams


class EveryOtherDrafter(OracleDrafter):
    """The oracle, but it proposes nothing on every other call (as after a plain round)."""

    name = "every-other"
    sampled_q = False
    abilities = Abilities()

    def __init__(self, refs: Sequence[list[int]]) -> None:
        super().__init__(refs)
        self.calls = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        self.calls += 1
        if self.calls % 2 == 0:
            return [Draft(token_ids=[]) for _ in requests]
        return super().propose(requests)


@pytest.mark.parametrize("every_other", [False, True])
def test_only_steady_state_draft_calls_are_priced(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], every_other: bool
) -> None:
    """A draft call right after a round that drafted nothing includes the drafter's catch-up:
    the cost model must not price k by it (a model drafter would be priced out for good), nor
    price its catch-up before any steady-state call was timed (the whole call would count)."""
    base = make_tiny(DrafterKind.NONE, max_batch=1)
    refs = [TINY_PROMPTS[0] + tiny_plain["greedy"][0]]
    drafter = EveryOtherDrafter(refs) if every_other else OracleDrafter(refs)
    eng = engine_with(base, drafter, k=2)
    priced: list[int] = []
    caught: list[int] = []
    observe, observe_catch_up = eng.cost.observe_draft, eng.cost.observe_catch_up
    eng.cost.observe_draft = lambda name, n, s: (priced.append(n), observe(name, n, s))  # type: ignore[method-assign]
    eng.cost.observe_catch_up = lambda name, n, s: (caught.append(n), observe_catch_up(name, n, s))  # type: ignore[method-assign]
    with running(eng):
        (res,) = run_batch(eng, TINY_PROMPTS[:1], TINY_SETTINGS["greedy"])
    assert res.token_ids == tiny_plain["greedy"][0]
    drafting_rounds = sum(1 for d, _ in drafter.rounds if d)
    assert drafting_rounds >= 3
    # every round drafts: all but the first are priced; every other round drafts: none is
    assert len(priced) == (0 if every_other else drafting_rounds - 1)
    assert caught == []  # the prompt's catch-up came before any steady-state price, and so did every_other's


class TwoSourceDrafter(OracleDrafter):
    """Two sources taking turns: the oracle (always accepted) and junk (never accepted)."""

    name = "two"

    def __init__(self, refs: Sequence[list[int]]) -> None:
        super().__init__(refs)
        self.turn = 0
        self.planned: dict[int, str] = {}
        self.ks: dict[str, list[int]] = {"two+oracle": [], "two+junk": []}
        self.abilities = Abilities(sources=self)

    def source(self, seq_id: int, tokens: Sequence[int], k_max: int) -> Source:
        self.turn += 1
        self.planned[seq_id] = "two+oracle" if self.turn % 2 else "two+junk"
        return Source(self.planned[seq_id])

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        drafts = super().propose(requests)
        for i, r in enumerate(requests):
            src = self.planned[r.seq_id]
            self.ks[src].append(r.k)
            if src == "two+junk":  # every token differs from the reference's (in 3..95): never accepted
                drafts[i] = Draft([3 + (t - 2) % 93 for t in drafts[i].token_ids])
        return drafts


def test_each_draft_source_has_its_own_controller(make_tiny: Callable[..., Engine]) -> None:
    """A drafter with sources (auto: lookups and a head): each source's acceptance is its own.

    One controller for both would see ~half the drafts accepted and draft the same K from both.
    """
    base = make_tiny(DrafterKind.NONE, max_batch=1)
    params = SamplingParams(max_new_tokens=160, ignore_eos=True)
    with running(base) as eng:
        (plain,) = run_batch(eng, TINY_PROMPTS[:1], params)
    drafter = TwoSourceDrafter([TINY_PROMPTS[0] + plain.token_ids])
    spec = engine_with(base, drafter, k=None)
    spec.policy.cost = FrozenCost()
    with running(spec) as eng:
        res = run_batch(eng, TINY_PROMPTS[:1], params)
        good_pool, junk_pool = eng.policy.pool("two+oracle"), eng.policy.pool("two+junk")
    assert res[0].token_ids == plain.token_ids
    good, junk = drafter.ks["two+oracle"], drafter.ks["two+junk"]
    assert len(junk) >= 8 and max(good) == 8
    assert good_pool is not None and junk_pool is not None
    assert good_pool.alpha() > 0.9 and junk_pool.alpha() < 0.15, (good_pool.alpha(), junk_pool.alpha())


def test_k_choice_sees_the_other_sequences_tokens_and_draft_calls_are_priced_per_request(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """other_tokens is tokens (k + 1 of each sequence chosen before, 1 for each still to choose),
    not a count of sequences; a batch's draft call is priced by its longest draft, the k a
    request looks up, not by the batch's total."""
    base = make_tiny(DrafterKind.NONE, max_batch=4)
    refs = [p + o for p, o in zip(TINY_PROMPTS, tiny_plain["greedy"], strict=True)]
    eng = engine_with(base, OracleDrafter(refs), k=None, k_max=3)
    choose, step = GoodputController.choose_k, eng._step
    seen: list[tuple[int, int]] = []  # (other_tokens, k chosen) in batch order
    rounds: list[list[tuple[int, int]]] = []

    def recorded_choose(ctl, cost, other_tokens=0, catch_up=0, remaining=None):  # noqa: ANN001, ANN202
        k = choose(ctl, cost, other_tokens, catch_up, remaining)
        seen.append((other_tokens, min(k, remaining - 1) if remaining is not None else k))
        return k

    def recorded_step(batch) -> None:  # noqa: ANN001
        seen.clear()
        step(batch)
        rounds.append(list(seen))

    monkeypatch.setattr(GoodputController, "choose_k", recorded_choose)
    monkeypatch.setattr(eng, "_step", recorded_step)
    priced: list[int] = []
    observe = eng.cost.observe_draft
    eng.cost.observe_draft = lambda name, n, s: (priced.append(n), observe(name, n, s))  # type: ignore[method-assign]
    try:
        res = run_batch(eng, TINY_PROMPTS[:3], TINY_SETTINGS["greedy"])
        assert_no_leaks(eng)
    finally:
        eng.shutdown()
    assert [r.token_ids for r in res] == tiny_plain["greedy"][:3]
    assert any(len(r) == 3 for r in rounds)
    for r in rounds:
        ks = [k for _, k in r]
        assert [o for o, _ in r] == [sum(k + 1 for k in ks[:i]) + len(r) - 1 - i for i in range(len(r))]
    assert any(k for r in rounds if len(r) == 3 for _, k in r)  # speculation ran with three in the batch
    assert priced and max(priced) <= 3  # the longest draft (k_max 3), never the batch's total
