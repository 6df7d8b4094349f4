"""The eagle drafter on the tiny model: fed by the target, drafts chains, couples sampling drafts, cleans up."""

from __future__ import annotations

import pytest
import torch

from draftgate.drafters.base import DraftRequest
from draftgate.drafters.eagle import EagleDrafter
from draftgate.engine.engine import Engine
from draftgate.engine.local_target import LocalTarget
from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=16)


def _drafter(tiny_model: LoadedModel) -> EagleDrafter:
    torch.manual_seed(0)
    cfg = tiny_model.config
    head = EagleHead(cfg, default_feature_layers(cfg.num_layers), torch.arange(cfg.vocab_size))
    head.attach_target(tiny_model.weights).init_weights(tiny_model.weights)
    return EagleDrafter(head, min_confidence=0.0)  # a random head: every chain K tokens


def test_drafts_need_the_targets_features(tiny_model: LoadedModel) -> None:
    d = _drafter(tiny_model)
    C = tiny_model.config.hidden_size
    nF = len(d.feature_layers)
    req = DraftRequest(7, [5, 6, 7, 8], 3, GREEDY)
    assert d.propose([req])[0].token_ids == []  # nothing fed yet
    d.feed(7, 0, torch.randn(2, nF, C))  # positions 0, 1: not yet up to position 2 (before the pending 8)
    assert d.propose([req])[0].token_ids == []
    d.feed(7, 2, torch.randn(1, nF, C))
    first = d.propose([req])[0].token_ids
    assert len(first) == 3 and all(0 <= t < tiny_model.config.vocab_size for t in first)
    assert d.propose([req])[0].token_ids == first  # drafting left no entries behind
    assert d.propose([DraftRequest(7, [5, 6, 7, 8], 0, GREEDY)])[0].token_ids == []
    d.release(7)
    assert d.propose([req])[0].token_ids == []


def test_the_heads_runner_ups_go_along_as_tree_leaves_where_likely_enough(tiny_model: LoadedModel) -> None:
    d = _drafter(tiny_model)
    C, nF = tiny_model.config.hidden_size, len(d.feature_layers)
    d.feed(1, 0, torch.randn(4, nF, C))
    req = DraftRequest(1, [1, 2, 3, 4, 5], 3, GREEDY)
    d.min_branch = None
    assert d.propose([req])[0].tree == ()
    d.min_branch = 1e-9  # a random head's runner-up has about 1 / V: a leaf beside every chain token
    draft = d.propose([req])[0]
    h = d._seqs[1]
    q = torch.softmax(h.last_logits, dim=-1)  # [Vs]: the head's first-token distribution
    top2 = [int(d.head.vocab_ids[j]) for j in q.topk(2).indices]
    assert draft.token_ids[0] == top2[0] and draft.tree[0] == (0, top2[1])
    assert [p for p, _ in draft.tree] == [0, 1, 2]  # each leaf beside chain token p + 1
    assert all(t != c for (_, t), c in zip(draft.tree, draft.token_ids, strict=True))
    # Just above the first runner-up's probability: no leaf there, and the deeper paths are less likely still.
    d.min_branch = float(q.topk(2).values[1]) * 1.01
    assert d.propose([req])[0].tree == ()
    with pytest.raises(ValueError, match="min_branch"):
        EagleDrafter(d.head, min_branch=0.0)


def test_sampling_drafts_are_coupled_to_the_targets_uniforms(tiny_model: LoadedModel) -> None:
    """One-hot guesses from the target's own uniforms: the same uniforms, the same draft."""
    d = _drafter(tiny_model)
    C, nF = tiny_model.config.hidden_size, len(d.feature_layers)
    d.feed(1, 0, torch.randn(4, nF, C))
    hot = SamplingParams(temperature=1.5, max_new_tokens=16, seed=3)
    g = torch.Generator().manual_seed(0)
    drafts = []
    for _ in range(6):
        u = torch.rand(5, 2, generator=g, dtype=torch.float64)
        a = d.propose([DraftRequest(1, [1, 2, 3, 4, 5], 4, hot, u)])[0]
        b = d.propose([DraftRequest(1, [1, 2, 3, 4, 5], 4, hot, u.clone())])[0]
        assert a.q is None and a.token_ids == b.token_ids and len(a.token_ids) == 4
        drafts.append(tuple(a.token_ids))
    assert len(set(drafts)) > 1  # the guess follows the uniforms


def test_the_engine_feeds_it_and_refuses_a_target_without_features(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=64)
    d = _drafter(tiny_model)
    eng = Engine(runner, d, k=3, max_batch=2)
    try:
        res = eng.complete([1, 5, 6, 7, 8], SamplingParams(max_new_tokens=12, ignore_eos=True))
        plain = Engine(ModelRunner(tiny_model, num_blocks=64), None, k=0)
        try:
            assert (
                res.token_ids
                == plain.complete([1, 5, 6, 7, 8], SamplingParams(max_new_tokens=12, ignore_eos=True)).token_ids
            )
        finally:
            plain.shutdown()
        assert res.stats.draft_tokens > 0
    finally:
        eng.shutdown()
    assert d._seqs == {}  # released with the request
    assert isinstance(eng.target, LocalTarget) and eng.target.tap is d

    class NotLocal:  # what the engine sees of any target that is not our runner here (gRPC, HTTP)
        tokenizer = tiny_model.tokenizer

    with pytest.raises(ValueError, match="hidden states"):
        Engine(NotLocal(), _drafter(tiny_model), k=3)  # type: ignore[arg-type]


def test_it_keeps_only_the_features_its_head_has_not_absorbed(tiny_model: LoadedModel) -> None:
    """A long request does not hold 7 KB of raw features per position: absorbed ones are dropped,
    and drafting in steps gives what one drafter fed everything at once gives."""
    C = tiny_model.config.hidden_size
    a, b = _drafter(tiny_model), _drafter(tiny_model)
    nF = len(a.feature_layers)
    feats = torch.randn(40, nF, C, generator=torch.Generator().manual_seed(4))  # positions 0..39
    toks = list(range(3, 45))
    a.feed(7, 0, feats[:30])
    first = a.propose([DraftRequest(7, toks[:31], 3, GREEDY)])[0].token_ids
    assert len(first) == 3 and a._seqs[7].g_n == 0  # all 30 absorbed
    a.feed(7, 30, feats[30:])
    b.feed(7, 0, feats)
    req = DraftRequest(7, toks[:41], 3, GREEDY)
    assert a.propose([req])[0].token_ids == b.propose([req])[0].token_ids
    assert a._seqs[7].g_n == b._seqs[7].g_n == 0 and a._seqs[7].g_start == 40
    a.head.truncate(a._seqs[7].cache, 35)  # entries whose features are gone: no draft, not a wrong one
    assert a.propose([req])[0].token_ids == []


def test_a_chain_runs_the_next_head_step_only_while_its_confidence_could_pass(tiny_model: LoadedModel) -> None:
    """min_continue: below it the chain ends without the head step for a token that would rarely pass
    min_confidence (each step costs a few percent of a target forward); at min_confidence, every step runs."""
    d = _drafter(tiny_model)
    C, nF = tiny_model.config.hidden_size, len(d.feature_layers)
    d.feed(1, 0, torch.randn(4, nF, C, generator=torch.Generator().manual_seed(1)))
    req = DraftRequest(1, [1, 2, 3, 4, 5], 4, GREEDY)
    calls = []
    step_many = d.head.step_many
    d.head.step_many = lambda *a, **kw: calls.append(1) or step_many(*a, **kw)  # type: ignore[method-assign]
    full = d.propose([req])[0].token_ids
    assert len(full) == 4 and len(calls) == 4  # absorb + 3 chain steps
    d.min_continue, calls[:] = 1.0, []  # a random head's probabilities are far below 1
    assert d.propose([req])[0].token_ids == full[:1] and calls == []  # the head's output at the pending token is kept
    with pytest.raises(ValueError, match="min_continue"):
        EagleDrafter(d.head, min_confidence=0.3, min_continue=0.2)
    assert EagleDrafter(d.head, min_confidence=0.6).min_continue == 1.0  # the default never passes 1
