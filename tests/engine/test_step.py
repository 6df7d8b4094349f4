"""The speculative step: ragged forward, batched verification, rollback, sampled-q drafters, bad drafts.

Statistical tests follow tests/verify: many trials, the empirical distribution of
an emitted token against the exact p, a total-variation bound from the sampling
noise, and a negative control (a drafter that lies about its q) the same check
must catch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.policy import SpeculationPolicy
from draftgate.engine.round import Round
from draftgate.engine.sequence import PositionRandom, SequenceState, StopChecker
from draftgate.engine.step import speculative_step
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.sampling import logits_to_probs
from draftgate.types import SamplingParams

V = 96  # tiny vocabulary
PROMPT = [5, 17, 33, 17, 33, 40, 41, 42, 17, 33]
X0 = 40  # the first output token (what prefill "emitted"), pending in every step below
GREEDY = SamplingParams(max_new_tokens=64, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, top_k=6, max_new_tokens=64, ignore_eos=True)


@pytest.fixture
def one_thread():  # noqa: ANN201
    """Thousands of ops on [4, 96] tensors: OpenMP threads only add overhead (a lot, on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def runner(tiny_model: LoadedModel) -> ModelRunner:
    return ModelRunner(tiny_model, num_blocks=256, block_size=8)


def _seq(
    runner: ModelRunner, params: SamplingParams, seed: int, seq_id: int, output: Sequence[int] = (X0,)
) -> SequenceState:
    s = SequenceState(
        list(PROMPT),
        params,
        PositionRandom(torch.Generator().manual_seed(seed)),
        StopChecker(runner.tokenizer, params),
        seq_id=seq_id,
    )
    s.append(list(output))
    return s


def _step(
    target: LocalTarget,
    drafter,
    seqs: Sequence[SequenceState],
    ks: Sequence[int],
    hidden: Sequence[bool] | None = None,  # noqa: ANN001
) -> list[Round]:
    """One speculative step with K fixed per sequence (``hidden``: the drafter failed on it before)."""
    policy = SpeculationPolicy(drafter, None, max([*ks, 1]))
    for i, (s, k) in enumerate(zip(seqs, ks, strict=True)):
        policy.open(s.seq_id, s.params, k=k)
        policy.state(s.seq_id).drafter_failed = bool(hidden and hidden[i])
    rounds = [Round(s, max([*ks, 0])) for s in seqs]
    speculative_step(target, drafter, policy, rounds)
    return rounds


def _prefill(runner: ModelRunner, seq_id: int) -> None:
    runner.prefill(seq_id, PROMPT)


def _logits_after(runner: ModelRunner, tokens: list[int]) -> Tensor:
    """Target logits [len(tokens), V] at each of tokens' positions after PROMPT, by a plain forward."""
    sid = 10_000
    runner.prefill(sid, PROMPT)
    try:
        (lg,) = runner.forward([ForwardItem(sid, tokens, len(tokens))])
    finally:
        runner.free(sid)
    return lg


# ------------------------------------------------------------------ sampled q (statistics)


def _tv(counts: Tensor, p: Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def _tv_bound(p: Tensor, n: int) -> float:
    """3x the expected TV of n exact samples: 0.5 * sum_i E|p^_i - p_i| ~ 0.5 * sum_i sqrt(2 p(1-p) / (pi n))."""
    return 3.0 * 0.5 * float(torch.sqrt(2.0 * p * (1 - p) / (math.pi * n)).sum())


def _draft_qs(p: Tensor, sparse: bool, seed: int) -> Tensor | SparseQ:
    """A q per position that overlaps p (so drafts are often accepted) but differs from it; [K, V] or sparse."""
    g = torch.Generator().manual_seed(seed)
    K = p.shape[0]
    w = p.sqrt() * torch.rand(K, V, generator=g) + 0.02 * torch.rand(K, V, generator=g)  # [K, V]
    if not sparse:
        return w / w.sum(-1, keepdim=True)  # dense, full support (also outside p's top-k)
    ids = w.topk(6, dim=-1).indices  # [K, 6]
    ids[:, -1] = (ids[:, 0] + 50) % V  # one id p (almost surely) gives no mass
    probs = w.gather(1, ids)  # [K, 6]
    return SparseQ(ids=ids, probs=probs / probs.sum(-1, keepdim=True))


def _dense(q: Tensor | SparseQ) -> Tensor:
    if isinstance(q, Tensor):
        return q
    return torch.zeros(q.ids.shape[0], V).scatter_add_(1, q.ids, q.probs)


def _sample_drafts(q: Tensor | SparseQ, k: int, g: torch.Generator) -> list[int]:
    return torch.multinomial(_dense(q)[:k], 1, generator=g).squeeze(1).tolist()


class SampledDrafter:
    """Drafts k tokens, token i drawn from q_i, and returns that q (dense or sparse)."""

    name = "sampled"
    sampled_q = True
    abilities = Abilities()

    def __init__(self, q: Tensor | SparseQ, seed: int) -> None:
        self.q = q
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            q = self.q
            q = q[: r.k] if isinstance(q, Tensor) else SparseQ(q.ids[: r.k], q.probs[: r.k])
            out.append(Draft(token_ids=_sample_drafts(self.q, r.k, self.g), q=q) if r.k else Draft([]))
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("sparse", [False, True], ids=["dense-q", "sparse-q"])
def test_step_with_sampled_drafter_emits_target_distribution(runner: ModelRunner, sparse: bool) -> None:
    """The whole step (drafter -> batched ragged forward -> verify -> rollback) keeps the first token ~ p."""
    B, R, K = 32, 40, 3
    logits = _logits_after(runner, [X0, 17, 33])  # [K, V] by a plain forward
    p = logits_to_probs(logits[:1], 1.0, SAMPLED.top_k, 1.0)[0]  # [V] exact p of the first output
    q_rows = logits_to_probs(logits, 1.0, 0, 1.0)  # [K, V]: q_0 overlaps p
    drafter = SampledDrafter(_draft_qs(q_rows, sparse, seed=4), seed=5)
    ids = range(100, 100 + B)
    for sid in ids:
        _prefill(runner, sid)
    counts = torch.zeros(V)
    accepted = 0
    try:
        for rep in range(R):
            seqs = [_seq(runner, SAMPLED, seed=rep * B + sid, seq_id=sid) for sid in ids]
            res = _step(LocalTarget(runner), drafter, seqs, [K] * B)
            for s, e, a in zip(seqs, [x.kept for x in res], [x.accepted for x in res], strict=True):
                counts[e[0]] += 1
                accepted += a
                # Rolled back to the accepted prefix.
                assert runner.length(s.seq_id) == len(s.history) - 1
                runner.truncate(s.seq_id, len(PROMPT))
            assert not any([x.draft_failed for x in res])
    finally:
        for sid in ids:
            runner.free(sid)
    assert accepted > B * R // 10, "drafts were rarely accepted: speculation was barely exercised"
    assert _tv(counts, p) < _tv_bound(p, B * R)


# ------------------------------------------------------------------ rollback on the runner


class FixedDrafter:
    """Proposes given drafts per seq_id; records what it was asked."""

    name = "fixed"
    sampled_q = False
    abilities = Abilities()

    def __init__(self, drafts: dict[int, Draft]) -> None:
        self.drafts = drafts
        self.asked: list[tuple[int, int]] = []

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        self.asked += [(r.seq_id, r.k) for r in requests]
        return [self.drafts[r.seq_id] for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


def test_step_ragged_batch_rolls_back_each_sequence(runner: ModelRunner) -> None:
    """k = 0, 1, 3, 8 in one forward, acceptance chosen per sequence; KV and outputs as plain decoding's."""
    # Plain greedy continuation after PROMPT + [X0].
    plain = [X0]
    sid = 200
    runner.prefill(sid, PROMPT)
    for _ in range(12):
        (lg,) = runner.forward([ForwardItem(sid, [plain[-1]])])
        plain.append(int(lg[-1].argmax()))
    runner.free(sid)
    cont = plain[1:]
    # (k, accepted): drafts equal the continuation up to `accepted`, then a wrong token.
    plan = {201: (0, 0), 202: (1, 1), 203: (3, 1), 204: (8, 8), 205: (8, 0), 206: (3, 3)}
    drafts = {}
    for sid, (k, a) in plan.items():
        d = cont[:a] + [(t + 1) % V for t in cont[a:k]]
        drafts[sid] = Draft(token_ids=d)
        runner.prefill(sid, PROMPT)
    drafter = FixedDrafter(drafts)
    seqs = [_seq(runner, GREEDY, seed=0, seq_id=sid) for sid in plan]
    try:
        res = _step(LocalTarget(runner), drafter, seqs, [k for k, _ in plan.values()])
        assert [x.drafted for x in res] == [k for k, _ in plan.values()]
        assert [x.accepted for x in res] == [a for _, a in plan.values()]
        assert sum(x.rows for x in res) == sum(k + 1 for k, _ in plan.values())
        for s, e, (_, a) in zip(seqs, [x.kept for x in res], plan.values(), strict=True):
            assert e == cont[: a + 1] and s.output == plain[: a + 2]
            assert runner.length(s.seq_id) == len(PROMPT) + 1 + a == len(s.history) - 1
        # A second step continues from the rolled-back state exactly as plain decoding would.
        res2 = _step(LocalTarget(runner), None, seqs, [0] * len(seqs))
        for s, e in zip(seqs, [x.kept for x in res2], strict=True):
            assert s.output == plain[: len(s.output)] and len(e) == 1
    finally:
        for sid in plan:
            runner.free(sid)
    runner.kv.check_no_leaks()


@pytest.mark.parametrize(
    "bad",
    [
        Draft(token_ids=[1, 2, 3, 4, 5]),  # more than k = 3
        Draft(token_ids=[1, V]),  # outside the vocabulary
        Draft(token_ids=[1, 2], q=torch.full((3, V), 1 / V)),  # q rows != drafts
        Draft(token_ids=[1], q=SparseQ(torch.tensor([[1, V + 3]]), torch.tensor([[0.5, 0.5]]))),
        Draft(token_ids=[1], q=SparseQ(torch.tensor([[1, 2]]), torch.tensor([[0.5, 0.9]]))),  # sums to 1.4
        Draft(token_ids=[1], q=SparseQ(torch.tensor([[1, 2]]), torch.tensor([[1.5, -0.5]]))),  # negative
        Draft(token_ids=[1], q=SparseQ(torch.tensor([[1, 2]]), torch.tensor([[float("nan"), 1.0]]))),
        Draft(token_ids=[3], q=SparseQ(torch.tensor([[1, 2]]), torch.tensor([[0.5, 0.5]]))),  # 3 not in its q
        Draft(token_ids=[1], q=torch.full((1, V), 2.0 / V)),  # dense, sums to 2
        None,  # the drafter raises for this sequence
    ],
    ids=[
        "too-long",
        "bad-id",
        "q-shape",
        "sparse-bad-id",
        "q-not-normalised",
        "q-negative",
        "q-nan",
        "token-outside-q",
        "dense-q-not-normalised",
        "raises",
    ],
)
def test_bad_draft_costs_only_its_sequence(runner: ModelRunner, bad: Draft | None) -> None:
    good = Draft(token_ids=[17, 33, 17])

    class Drafter(FixedDrafter):
        def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
            if bad is None and any(r.seq_id == 302 for r in requests):
                raise RuntimeError("drafter crashed on 302")
            return super().propose(requests)

    drafter = Drafter({301: good, 302: bad or good, 303: good})
    seqs = []
    for sid in (301, 302, 303):
        runner.prefill(sid, PROMPT)
        seqs.append(_seq(runner, GREEDY, seed=0, seq_id=sid))
    try:
        res = _step(LocalTarget(runner), drafter, seqs, [3, 3, 3])
        assert [x.draft_failed for x in res] == [False, True, False]
        assert [x.drafted for x in res] == [3, 0, 3]
        for s in seqs:
            assert runner.length(s.seq_id) == len(s.history) - 1
    finally:
        for sid in (301, 302, 303):
            runner.free(sid)


def test_a_drafter_failing_on_a_non_drafting_sequence_costs_the_drafting_one_nothing(runner: ModelRunner) -> None:
    """The culprit may be a sequence with k = 0 in the call: the one drafting sequence is asked alone.

    (Before the fix, a batch with one drafting sequence was never retried, so a failed drafter's
    plain request cost every newcomer its drafts for good: test_failed_drafter_degrades_to_plain_decoding
    flaked on it.) A sequence marked hidden is not shown to the drafter at all.
    """
    good = Draft(token_ids=[17, 33, 17])
    calls: list[list[int]] = []

    class Drafter(FixedDrafter):
        def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
            calls.append([r.seq_id for r in requests])
            if any(r.seq_id == 312 for r in requests):
                raise RuntimeError("drafter crashed on 312")
            return super().propose(requests)

    drafter = Drafter({311: good, 312: good})
    seqs = []
    for sid in (311, 312):
        runner.prefill(sid, PROMPT)
        seqs.append(_seq(runner, GREEDY, seed=0, seq_id=sid))
    try:
        res = _step(LocalTarget(runner), drafter, seqs, [3, 0])
        assert [x.drafted for x in res] == [3, 0] and [x.draft_failed for x in res] == [False, False]
        assert calls == [[311, 312], [311]]
        calls.clear()
        res = _step(LocalTarget(runner), drafter, seqs, [3, 0], hidden=[False, True])
        assert [x.drafted for x in res] == [3, 0] and calls == [[311]]
        for s in seqs:
            assert runner.length(s.seq_id) == len(s.history) - 1
    finally:
        for sid in (311, 312):
            runner.free(sid)


# ------------------------------------------------------------------ draft trees (Draft.tree)


def _plain_output(runner: ModelRunner, params: SamplingParams, n: int) -> list[int]:
    """The output plain decoding gives after PROMPT (first token X0) with seed 0: n more tokens."""
    sid = 499
    runner.prefill(sid, PROMPT)
    s = _seq(runner, params, seed=0, seq_id=sid)
    try:
        while len(s.output) < n + 1:
            _step(LocalTarget(runner), None, [s], [0])
    finally:
        runner.free(sid)
    return list(s.output)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_draft_tree_keeps_the_path_the_target_follows(runner: ModelRunner, params: SamplingParams) -> None:
    """A draft's tree nodes run in the same forward under a tree mask; the path the target's own
    choices follow is kept (its KV moved into place), so the output is plain decoding's either way."""
    plain = _plain_output(runner, params, 8)
    c = plain[1:]
    w = lambda t: (t + 1) % V  # noqa: E731  # a wrong token
    # seq -> (chain, tree nodes (parent, token), accepted); nodes: 0 pending, 1..k chain, k+1.. tree
    plan = {
        401: ([w(c[0]), 5, 6], ((0, c[0]),), 1),  # the chain misses, its sibling holds
        402: ([c[0], c[1], w(c[2])], ((0, w(c[0])),), 2),  # the chain holds
        403: ([w(c[0])], ((0, w(w(c[0]))),), 0),  # both miss
        404: ([c[0], w(c[1]), 8], ((1, c[1]), (4, c[2])), 3),  # a sibling with a child of its own, all held
        405: ([w(c[0]), 7], ((0, c[0]), (3, w(c[1]))), 1),
        406: ([c[0], c[1], c[2]], ((0, w(c[0])), (1, w(c[1])), (2, w(c[2]))), 3),  # a leaf beside each token
        407: ([w(c[0]), 3, 4], ((0, w(w(c[0]))), (0, c[0]), (5, c[1])), 2),  # two siblings, the second holds
    }
    for sid in plan:
        runner.prefill(sid, PROMPT)
    drafter = FixedDrafter({sid: Draft(d, tree=t) for sid, (d, t, _) in plan.items()})
    seqs = [_seq(runner, params, seed=0, seq_id=sid) for sid in plan]
    try:
        res = _step(LocalTarget(runner), drafter, seqs, [3] * len(plan))
        assert [x.accepted for x in res] == [a for *_, a in plan.values()]
        assert [x.branch_rows for x in res] == [len(t) for _, t, _ in plan.values()]
        assert sum(x.rows for x in res) == sum(len(d) + 1 + len(t) for d, t, _ in plan.values())
        for s, (*_, a) in zip(seqs, plan.values(), strict=True):
            assert s.output == plain[: a + 2]
            assert runner.length(s.seq_id) == len(s.history) - 1
        # The next rounds continue from the kept path's KV exactly as plain decoding would.
        for _ in range(3):
            _step(LocalTarget(runner), None, seqs, [0] * len(seqs))
        for s in seqs:
            assert s.output == plain[: len(s.output)]
    finally:
        for sid in plan:
            runner.free(sid)
    runner.kv.check_no_leaks()


@pytest.mark.parametrize(("blocks", "accepted"), [(2, 0), (3, 3)])
def test_a_draft_tree_is_skipped_without_blocks_to_spare(tiny_model: LoadedModel, blocks: int, accepted: int) -> None:
    """PROMPT and the chain's 4 rows fill 2 blocks of 8, the tree's 3 nodes need a third; without it
    the round verifies the chain alone, as if no tree came (with it, the tree's path holds)."""
    small = ModelRunner(tiny_model, num_blocks=blocks, block_size=8)
    plain = _plain_output(small, GREEDY, 4)
    small.prefill(1, PROMPT)
    s = _seq(small, GREEDY, seed=0, seq_id=1)
    try:
        c = plain[1:]
        d = Draft([(c[0] + 1) % V, 3, 4], tree=((0, c[0]), (4, c[1]), (5, c[2])))
        res = _step(LocalTarget(small), FixedDrafter({1: d}), [s], [3])
        assert (
            [x.accepted for x in res] == [accepted]
            and s.output == plain[: accepted + 2]
            and small.kv.num_sequences == 1
        )
        ran = 3 if accepted else 0  # a skipped tree ran no rows: none counted, none priced
        assert [x.branch_rows for x in res] == [ran] and sum(x.rows for x in res) == 4 + ran
    finally:
        small.free(1)
    small.kv.check_no_leaks()


@pytest.mark.parametrize(
    ("draft", "problem"),
    [
        (Draft([1, 2], tree=((0, 1),)), "repeats a sibling's token"),
        (Draft([1], tree=((0, 2), (0, 3))), "at least as many chain tokens"),
        (Draft([], tree=((0, 2),)), "at least as many chain tokens"),
        (Draft([1], q=torch.full((1, V), 1 / V), tree=((0, 2),)), "one-hot"),
        (Draft([1], tree=((0, V),)), "tree token ids"),
        (Draft([1, 2], tree=((3, 5),)), "parent must be an earlier node"),
        (Draft([1, 2], tree=((2, 5),)), "deeper than the chain"),
    ],
)
def test_a_bad_draft_tree_is_a_bad_draft(draft: Draft, problem: str) -> None:
    from draftgate.drafters.base import draft_problem

    assert problem in (draft_problem(draft, 3, V) or "")
    assert draft_problem(Draft([1, 2], tree=((0, 3), (3, 4))), 3, V) is None
