"""verify_round: one call verifies a whole round (matching for one-hot drafts, rejection for sampled q).

Three levels, as in tests/verify/test_rejection.py: exact tables (the matching prefix, the
target's choice), a batched round equal to its sequences verified one by one, and a statistical
test of sampled-q drafts with a negative control (a drafter that lies about its q).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from draftgate.sampling import logits_to_probs, sample_from_probs
from draftgate.verify import RoundDraft, target_choice, verify_round

V = 96
GREEDY = (0.0, 0, 1.0)  # temperature, top_k, top_p
SAMPLED = (1.0, 6, 1.0)


def _rd(tokens: list[int], params: tuple[float, int, float], u: Tensor | None, q=None) -> RoundDraft:  # noqa: ANN001
    t, k, p = params
    return RoundDraft(tokens, t, k, p, None if t == 0 else u, q)


def _choice(logits: Tensor, params: tuple[float, int, float], u: Tensor) -> Tensor:
    n = logits.shape[0]
    t, k, p = params
    return target_choice(logits, torch.full((n,), t), torch.full((n,), k), torch.full((n,), p), u[:, 1])


def test_target_choice_is_argmax_or_the_positions_sample() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, V, generator=g)  # [5, V]
    u = torch.rand(5, 2, generator=g, dtype=torch.float64)  # [5, 2]
    assert torch.equal(_choice(logits, GREEDY, u), logits.argmax(-1))
    want = sample_from_probs(logits_to_probs(logits, 1.0, 6, 1.0), u[:, 1])
    assert torch.equal(_choice(logits, SAMPLED, u), want)
    # Per-row parameters: a greedy row and a sampled row side by side.
    mixed = target_choice(
        logits[:2], torch.tensor([0.0, 1.0]), torch.tensor([0, 6]), torch.tensor([1.0, 1.0]), u[:2, 1]
    )
    assert mixed.tolist() == [int(logits[0].argmax()), int(want[1])]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize(
    ("match", "accepted"), [([], 0), ([0], 1), ([0, 1], 2), ([0, 1, 2], 3), ([1, 2], 0), ([0, 2], 1)]
)
def test_deterministic_drafts_accept_the_matching_prefix(
    params: tuple[float, int, float], match: list[int], accepted: int
) -> None:
    """One-hot drafts: accepted while equal to the target's own choice; then that choice is emitted."""
    g = torch.Generator().manual_seed(len(match) * 7 + accepted)
    logits = torch.randn(4, V, generator=g) * 3  # [K+1, V]
    u = torch.rand(4, 2, generator=g, dtype=torch.float64)  # [K+1, 2]
    choice = _choice(logits, params, u).tolist()  # what plain decoding emits at each position
    drafts = [choice[i] if i in match else (choice[i] + 1) % V for i in range(3)]
    out = verify_round(logits, [_rd(drafts, params, u)])
    assert out.accepted == [accepted] and out.emitted == [choice[: accepted + 1]]


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_tree_round_is_the_chain_round_along_its_accepted_path(params: tuple[float, int, float]) -> None:
    """A tree draft emits what a chain draft of its accepted path emits against the same rows (the
    path's rows, each with its depth's uniform), and the path is the one the target's choices pick."""
    g = torch.Generator().manual_seed(5)
    hits = 0
    for trial in range(200):
        k = 4
        logits = torch.randn(2 * k + 1, V, generator=g) * 3  # [rows, V]: pending, chain, tree
        u = torch.rand(k + 1, 2, generator=g, dtype=torch.float64)  # [k+1, 2] per depth
        t, top_k, top_p = params
        # Draft the target's own choice at some nodes so that paths run deep (choices by row and depth).
        chain, tree, depth = [], [], [0]
        pick = lambda row, d, lg=logits, u=u: int(_choice(lg[row : row + 1], params, u[d : d + 1])[0])  # noqa: E731
        for i in range(k):
            chain.append(pick(i, i) if trial % 3 else (pick(i, i) + 1) % V)
            depth.append(i + 1)
        for parent in torch.randint(0, k + 1, (k,), generator=g).tolist():
            parent = min(parent, k - 1)  # no deeper than the chain (the uniforms cover k + 1 positions)
            have = {tok for (p, tok) in tree if p == parent} | ({chain[parent]} if parent < k else set())
            tok = pick(parent, depth[parent])
            tok = tok if tok not in have else next(x for x in range(V) if x not in have)
            tree.append((parent, tok))
            depth.append(depth[parent] + 1)
        d = RoundDraft(chain, t, top_k, top_p, None if t == 0 else u, None, tuple(tree))
        out = verify_round(logits, [d])
        path = out.paths[0]
        rows = [0, *path]
        assert [depth[r] for r in rows] == list(range(len(rows)))  # a path: one node a depth
        tokens = [chain[n - 1] if n <= k else tree[n - k - 1][1] for n in path]
        alone = verify_round(logits[rows], [RoundDraft(tokens, t, top_k, top_p, None if t == 0 else u[: len(rows)])])
        assert out.emitted[0] == alone.emitted[0] and out.accepted[0] == len(path) == alone.accepted[0]
        hits += any(n > k for n in path)
    assert hits > 20  # tree nodes were taken often, not only the chain


def test_a_batched_round_equals_each_sequence_verified_alone() -> None:
    """k = 0, 2, 5, 3, 1 with greedy, sampled, dense-q and sparse-q rows, all in one call."""
    g = torch.Generator().manual_seed(11)
    ks = [0, 2, 5, 3, 1]
    rows = [torch.randn(k + 1, V, generator=g) * 2 for k in ks]
    us = [torch.rand(k + 1, 2, generator=g, dtype=torch.float64) for k in ks]
    dense = torch.softmax(torch.randn(5, V, generator=g), -1)[:5]  # [5, V]
    sparse_ids = torch.randint(0, V, (3, 4), generator=g)
    sparse = (sparse_ids, torch.full((3, 4), 0.25))
    drafts = [
        _rd([], GREEDY, us[0]),
        _rd([int(rows[1][0].argmax()), 7], GREEDY, us[1]),
        _rd(torch.multinomial(dense, 1, generator=g).squeeze(1).tolist(), SAMPLED, us[2], dense),
        _rd(sparse_ids[:, 0].tolist(), SAMPLED, us[3], sparse),
        _rd([3], SAMPLED, us[4]),
    ]
    together = verify_round(torch.cat(rows), drafts)
    for b, (row, d) in enumerate(zip(rows, drafts, strict=True)):
        alone = verify_round(row, [d])
        assert (together.emitted[b], together.accepted[b]) == (alone.emitted[0], alone.accepted[0])


# ------------------------------------------------------------------ sampled q (statistics)


def _tv(counts: Tensor, p: Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def _tv_bound(p: Tensor, n: int) -> float:
    """3x the expected TV of n exact samples: 0.5 * sum_i E|p^_i - p_i| ~ 0.5 * sum_i sqrt(2 p(1-p) / (pi n))."""
    return 3.0 * 0.5 * float(torch.sqrt(2.0 * p * (1 - p) / (math.pi * n)).sum())


def _draft_qs(p: Tensor, sparse: bool, seed: int) -> Tensor | tuple[Tensor, Tensor]:
    """A q per position that overlaps p (so drafts are often accepted) but differs from it; [K, V] or sparse."""
    g = torch.Generator().manual_seed(seed)
    K = p.shape[0]
    w = p.sqrt() * torch.rand(K, V, generator=g) + 0.02 * torch.rand(K, V, generator=g)  # [K, V]
    if not sparse:
        return w / w.sum(-1, keepdim=True)  # dense, full support (also outside p's top-k)
    ids = w.topk(6, dim=-1).indices  # [K, 6]
    ids[:, -1] = (ids[:, 0] + 50) % V  # one id p (almost surely) gives no mass
    probs = w.gather(1, ids)  # [K, 6]
    return ids, probs / probs.sum(-1, keepdim=True)


def _dense(q: Tensor | tuple[Tensor, Tensor]) -> Tensor:
    if isinstance(q, Tensor):
        return q
    return torch.zeros(q[0].shape[0], V).scatter_add_(1, q[0], q[1])


def _flatter(q: Tensor | tuple[Tensor, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
    """q at four times the temperature: what a drafter reports if it forgets its own transform."""
    if isinstance(q, Tensor):
        return q**0.25 / (q**0.25).sum(-1, keepdim=True)
    return q[0], q[1] ** 0.25 / (q[1] ** 0.25).sum(-1, keepdim=True)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense-q", "sparse-q"])
def test_sampled_q_drafts_emit_p(sparse: bool) -> None:
    """First emitted token ~ p_0; second (after an accepted first) ~ p_1. A lying q is caught."""
    K, N = 3, 1500
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(K + 1, V, generator=g)  # [K+1, V]: fixed target rows for every trial
    p = logits_to_probs(logits, *SAMPLED)  # [K+1, V]
    q = _draft_qs(p[:K], sparse, seed=1)
    liar = _flatter(q)  # a drafter that reports q before its temperature transform
    first, second, lied = torch.zeros(V), torch.zeros(V), torch.zeros(V)
    for _ in range(N):
        x = torch.multinomial(_dense(q), 1, generator=g).squeeze(1).tolist()
        u = torch.rand(K + 1, 2, generator=g, dtype=torch.float64)  # [K+1, 2]
        out = verify_round(torch.cat([logits, logits]), [_rd(x, SAMPLED, u, q), _rd(x, SAMPLED, u, liar)])
        (good, bad), a = out.emitted, out.accepted[0]
        assert len(good) == a + 1 and good[:a] == x[:a]
        first[good[0]] += 1
        if a >= 1:
            second[good[1]] += 1
        lied[bad[0]] += 1
    assert _tv(first, p[0]) < _tv_bound(p[0], N)
    n2 = int(second.sum())
    assert n2 > N // 3, "drafts were rarely accepted: the second position is barely tested"
    assert _tv(second, p[1]) < _tv_bound(p[1], n2)
    assert _tv(lied, p[0]) > _tv_bound(p[0], N), "the check cannot tell a wrong q from the right one"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_round_on_cuda_logits_equals_the_cpu_round() -> None:
    """The runner's logits live on the GPU there; drafts, q and uniforms come from the CPU."""
    g = torch.Generator().manual_seed(11)
    ks = [2, 5, 3, 0]
    rows = [torch.randn(k + 1, V, generator=g) * 2 for k in ks]
    us = [torch.rand(k + 1, 2, generator=g, dtype=torch.float64) for k in ks]
    dense = torch.softmax(torch.randn(5, V, generator=g), -1)
    sparse_ids = torch.randint(0, V, (3, 4), generator=g)
    drafts = [
        _rd([int(rows[0][0].argmax()), 7], SAMPLED, us[0]),
        _rd(torch.multinomial(dense, 1, generator=g).squeeze(1).tolist(), SAMPLED, us[1], dense),
        _rd(sparse_ids[:, 0].tolist(), SAMPLED, us[2], (sparse_ids, torch.full((3, 4), 0.25))),
        _rd([], SAMPLED, us[3]),
    ]
    cpu = verify_round(torch.cat(rows), drafts)
    gpu = verify_round(torch.cat(rows).cuda(), drafts)
    assert (gpu.emitted, gpu.accepted) == (cpu.emitted, cpu.accepted)
