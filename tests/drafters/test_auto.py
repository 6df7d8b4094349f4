"""auto: lookup drafts first, a model drafter only where lookup finds little and it pays."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from draftgate.drafters import Abilities, Draft, DraftRequest
from draftgate.drafters.auto import AutoDrafter
from draftgate.types import SamplingParams

P = SamplingParams()


class CountingDrafter:
    """A deterministic model-drafter stand-in: always proposes k copies of token 7."""

    name = "counting"
    sampled_q = False
    abilities = Abilities()

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.released: list[int] = []

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        self.calls.extend(r.seq_id for r in requests)
        return [Draft([7] * r.k) for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        self.released.append(seq_id)


def test_lookup_only_without_model() -> None:
    d = AutoDrafter()
    hist = [1, 2, 3, 4, 5, 1, 2, 3]
    (out,) = d.propose([DraftRequest(1, hist, 3, P)])
    assert out.token_ids == [4, 5, 1]
    (none,) = d.propose([DraftRequest(2, [9, 8, 7], 3, P)])
    assert none.token_ids == []


def test_model_used_only_where_lookup_is_empty() -> None:
    m = CountingDrafter()
    d = AutoDrafter(model=m)
    reqs = [DraftRequest(1, [1, 2, 3, 4, 1, 2, 3], 4, P), DraftRequest(2, [10, 11, 12], 4, P)]
    a, b = d.propose(reqs)
    assert a.token_ids == [4, 1, 2, 3] and b.token_ids == [7, 7, 7, 7]
    assert m.calls == [2]


def test_the_model_drafts_every_round_lookup_leaves_empty_however_it_fared() -> None:
    """Whether its drafts pay is the source's goodput controller's call (K down to 0), not auto's."""
    m = CountingDrafter()
    d = AutoDrafter(model=m)
    req = DraftRequest(5, [10, 11, 12], 4, P)
    for _ in range(8):  # rounds with nothing accepted
        assert d.propose([req])[0].token_ids == [7, 7, 7, 7]
        d.observe(5, req.tokens, 4, 0)
    assert len(m.calls) == 8


def test_release_reaches_the_model() -> None:
    m = CountingDrafter()
    d = AutoDrafter(model=m)
    d.propose([DraftRequest(3, [1, 2], 2, P)])
    d.release(3)
    assert m.released == [3]


class HeadLike(CountingDrafter):
    """A stand-in for the draft head: reads the target's features, which auto passes through."""

    feature_layers = (1,)

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[tuple[int, int]] = []
        self.abilities = Abilities(features=self)

    def feed(self, seq_id: int, start: int, feats: object) -> None:
        self.fed.append((seq_id, start))


def test_auto_passes_the_targets_features_to_a_head() -> None:
    m = HeadLike()
    d = AutoDrafter(model=m)
    assert d.feature_layers == (1,) and AutoDrafter().feature_layers == ()
    d.feed(4, 10, object())
    assert m.fed == [(4, 10)]


def test_source_names_the_rounds_drafter_and_propose_keeps_to_it() -> None:
    """The engine asks which source drafts next (one controller each); propose then drafts from it."""
    m = CountingDrafter()
    d = AutoDrafter(model=m)
    grounded, free = [1, 2, 3, 4, 1, 2, 3], [10, 11, 12]
    assert d.source(1, grounded, 8).name == "auto" and d.source(2, free, 8).name == "auto+counting"
    assert AutoDrafter().source(3, free, 8).name == "auto"
    assert d.source(1, grounded, 8).lookup and not d.source(2, free, 8).lookup  # lookup drafts are priced once proposed
    a, b = d.propose([DraftRequest(1, grounded, 2, P), DraftRequest(2, free, 3, P)])  # K from each source's controller
    assert a.token_ids == [4, 1] and b.token_ids == [7, 7, 7] and m.calls == [2]
    assert d.source(2, free, 8).name == "auto+counting"
    (c,) = d.propose([DraftRequest(2, [*free, 7], 3, P)])  # history moved on: the plan is stale, decided afresh
    assert c.token_ids == [7, 7, 7] and m.calls == [2, 2]


def test_lookup_keeps_the_turn_wherever_it_proposes_even_after_misses() -> None:
    """Lookup's hits are bursty (grounded text): misses never hand its proposals to the model."""
    m = CountingDrafter()
    d = AutoDrafter(model=m)
    grounded = [1, 2, 3, 4, 1, 2, 3]
    for _ in range(6):
        (x,) = d.propose([DraftRequest(1, grounded, 4, P)])
        assert x.token_ids == [4, 1, 2, 3]  # lookup drafted ...
        d.observe(1, grounded, len(x.token_ids), 0)  # ... and missed
    assert m.calls == [] and d.source(1, grounded, 8).name == "auto"
    gap = [*grounded, 99, 98]  # nothing to look up: the model's turn
    assert d.source(1, gap, 8).name == "auto+counting"
    (y,) = d.propose([DraftRequest(1, gap, 4, P)])
    assert y.token_ids == [7, 7, 7, 7] and m.calls == [1]


def test_a_head_also_takes_the_rounds_where_lookup_proposes_under_three_tokens() -> None:
    """With a draft head, a lookup draft shorter than min(3, K) hands the round to the head."""
    short, long_ = [5, 1, 1], [1, 2, 3, 4, 1, 2, 3]  # lookup proposes [1]; [4, 1, 2, 3]
    m = HeadLike()
    d = AutoDrafter(model=m)
    assert d.source(1, short, 8).name == "auto+counting" and d.source(2, long_, 8).name == "auto"
    a, b = d.propose([DraftRequest(1, short, 4, P), DraftRequest(2, long_, 4, P)])
    assert a.token_ids == [7, 7, 7, 7] and b.token_ids == [4, 1, 2, 3] and m.calls == [1]
    (c,) = d.propose([DraftRequest(3, short, 1, P)])  # K = 1: lookup's one token is all K asks for
    assert c.token_ids == [1] and m.calls == [1]
    model = CountingDrafter()  # a draft model (no features): only where lookup proposes nothing
    (e,) = AutoDrafter(model=model).propose([DraftRequest(4, short, 4, P)])
    assert e.token_ids == [1] and model.calls == []
    (f,) = AutoDrafter(model=model, min_lookup=3).propose([DraftRequest(5, short, 4, P)])
    assert f.token_ids == [7, 7, 7, 7] and model.calls == [5]


def _answer_earlier_request(d: AutoDrafter) -> None:
    """A finished request (prompt [100], output [1, ..., 8]): its output goes to the global trie."""
    d.observe(1, [100], 0, 0)
    d.observe(1, [100, 1, 2, 3, 4, 5, 6, 7, 8], 0, 0)
    d.release(1)


def test_a_global_draft_on_a_short_context_match_does_not_keep_the_turn_from_the_head() -> None:
    """Copied from an earlier request on < MIN_GLOBAL_MATCH tokens of context, a lookup draft is
    weak evidence (measured: accepted 0.05-0.35 tokens where the head had 0.41-0.86): the head
    drafts instead. A longer match, or the request's own text, keeps lookup's turn; where the head
    does not draft, the global draft is still lookup's."""
    m = HeadLike()
    d = AutoDrafter(model=m)
    _answer_earlier_request(d)
    short, long_ = [50, 2, 3], [50, 1, 2, 3, 4]  # 2 and 4 tokens of context match the earlier output
    assert d._suffix.match(2, short, 4).from_global and d._suffix.match(3, long_, 4).from_global
    assert d.source(2, short, 8).name == "auto+counting" and d.source(3, long_, 8).name == "auto"
    a, b = d.propose([DraftRequest(2, short, 4, P), DraftRequest(3, long_, 4, P)])
    assert a.token_ids == [7, 7, 7, 7] and b.token_ids == [5, 6, 7, 8] and m.calls == [2]
    own = [50, 2, 3, 9, 9, 2, 3]  # the request's own (2, 3) -> 9: its own text, lookup's turn
    assert d.source(4, own, 8).name == "auto"
    old = AutoDrafter(model=HeadLike(), min_global_match=0)  # the rule off: any draft of >= 3 tokens
    _answer_earlier_request(old)
    assert old.source(2, short, 8).name == "auto"
    lookup_only = AutoDrafter()  # no model: the global draft drafts
    _answer_earlier_request(lookup_only)
    assert lookup_only.propose([DraftRequest(2, short, 4, P)])[0].token_ids == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="min_global_match"):
        AutoDrafter(min_global_match=-1)
