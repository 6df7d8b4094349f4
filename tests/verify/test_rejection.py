"""Tests for draftgate.verify.rejection, at three levels (as vLLM's rejection sampler tests):

a. exact tables: hand-written greedy and sampling cases with known outputs;
b. seeded determinism: per-row generators make a row independent of its batch;
c. statistics: many trials in the batch dimension; every emitted position must
   follow the target distribution p. A test-local copy of the seed's broken
   residual is the negative control: the same check must catch it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from draftgate.sampling import draw_uniforms, logits_to_probs, sample_from_probs
from draftgate.verify import VerifyResult, verify_greedy, verify_sampling
from draftgate.verify.rejection import DraftQ, _accepted_prefix, _emit, _q_at, _q_of_drafts

# ---------------------------------------------------------------- a. exact tables


def _logits_with_argmax(argmax: list[list[int]], V: int = 8) -> Tensor:
    a = torch.tensor(argmax)  # [B, K+1]
    noise = torch.rand(*a.shape, V, generator=torch.Generator().manual_seed(0))  # [B, K+1, V]
    return noise.scatter(2, a[..., None], 5.0)  # [B, K+1, V]


def _greedy(drafts: list[list[int]], lens: list[int], argmax: list[list[int]]) -> VerifyResult:
    draft_ids = torch.tensor(drafts, dtype=torch.long).reshape(len(lens), -1)  # [B, K]
    return verify_greedy(draft_ids, torch.tensor(lens), _logits_with_argmax(argmax))


@pytest.mark.parametrize(
    ("drafts", "argmax", "tokens", "accepted"),
    [
        ([1, 2], [1, 2, 3], [1, 2, 3], 2),  # all accepted -> bonus
        ([1, 2], [4, 2, 3], [4, -1, -1], 0),  # first mismatch -> recovered
        ([1, 2], [1, 5, 3], [1, 5, -1], 1),  # second mismatch -> recovered
    ],
)
def test_greedy_table(
    drafts: list[int], argmax: list[int], tokens: list[int], accepted: int
) -> None:
    out = _greedy([drafts], [len(drafts)], [argmax])
    assert out.tokens.tolist() == [tokens]
    assert out.num_accepted.tolist() == [accepted]
    assert out.tokens.dtype == torch.int64 and out.num_accepted.dtype == torch.int64


def test_greedy_k0_emits_the_argmax() -> None:
    out = _greedy([[], []], [0, 0], [[3], [6]])
    assert out.tokens.tolist() == [[3], [6]]
    assert out.num_accepted.tolist() == [0, 0]


def test_greedy_jagged_lengths_ignore_padding() -> None:
    # Row 1 has one draft; its padding equals the argmax but must not count.
    # Row 2 has none; row 3's padding is -1.
    out = _greedy(
        [[1, 2, 3], [1, 2, 3], [7, 7, 7], [4, -1, -1]],
        [3, 1, 0, 1],
        [[1, 2, 3, 4], [1, 2, 3, 4], [7, 7, 7, 7], [4, 5, 6, 0]],
    )
    assert out.tokens.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [7, -1, -1, -1], [4, 5, -1, -1]]
    assert out.num_accepted.tolist() == [3, 1, 0, 1]


def test_sampling_with_one_hot_p_matches_greedy() -> None:
    argmax = [[1, 2, 3], [4, 2, 3], [1, 5, 3], [0, 0, 0]]
    logits = _logits_with_argmax(argmax)  # [4, 3, 8]
    draft_ids = torch.tensor([[1, 2], [1, 2], [1, 2], [0, -1]])  # [4, 2]
    lens = torch.tensor([2, 2, 2, 1])
    p = logits_to_probs(logits.reshape(12, 8), 0.0, 0, 1.0).reshape(4, 3, 8)  # [4, 3, 8]
    u = torch.rand(4, 3, generator=torch.Generator().manual_seed(1))  # [4, 3]
    sampled = verify_sampling(draft_ids, lens, p, None, u[:, :2], u[:, 2])
    greedy = verify_greedy(draft_ids, lens, logits)
    assert torch.equal(sampled.tokens, greedy.tokens)
    assert torch.equal(sampled.num_accepted, greedy.num_accepted)


def test_sampling_residual_uses_the_whole_q_vector() -> None:
    p = torch.tensor([[[0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]]])  # [1, 2, 4]
    q = torch.tensor([[[0.7, 0.0, 0.0, 0.3]]])  # [1, 1, 4]
    draft = torch.tensor([[0]])  # p/q = 1/7 at the draft
    lens = torch.tensor([1])
    # Rejected (0.5 >= 1/7); residual max(0, p - q) = [0, 0.6, 0.3, 0] -> [0, 2/3, 1/3, 0].
    for u_sample, token in ((0.0, 1), (0.5, 1), (0.7, 2), (0.99, 2)):
        out = verify_sampling(draft, lens, p, q, torch.tensor([[0.5]]), torch.tensor([u_sample]))
        assert out.tokens.tolist() == [[token, -1]] and out.num_accepted.tolist() == [0]
    # Accepted (0.1 < 1/7) -> bonus from p at position 1.
    out = verify_sampling(draft, lens, p, q, torch.tensor([[0.1]]), torch.tensor([0.6]))
    assert out.tokens.tolist() == [[0, 2]] and out.num_accepted.tolist() == [1]


def test_sampling_p_equal_q_never_rejects_and_residual_guard() -> None:
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])  # [1, 2, 3]
    out = verify_sampling(
        torch.tensor([[1]]),
        torch.tensor([1]),
        p,
        p[:, :1],
        torch.tensor([[0.999]]),
        torch.tensor([0.3]),
    )
    assert out.tokens.tolist() == [[1, 2]]
    # Forced rejection of a token with p == 0 (q sent nonsense): residual = p - q = 0 -> sample p.
    p0 = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])  # [1, 2, 3]
    out = verify_sampling(
        torch.tensor([[0]]),
        torch.tensor([1]),
        p0,
        p0[:, :1],
        torch.tensor([[0.0]]),
        torch.tensor([0.5]),
    )
    assert out.tokens.tolist() == [[1, -1]]


def test_sparse_and_dense_and_one_hot_q_agree() -> None:
    V = 6
    dense = torch.tensor(
        [[[0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]]
    )  # [1, 2, 6]
    ids = torch.tensor([[[1, 0], [3, 0]]])  # [1, 2, 2] padded with a zero-probability id
    probs = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])  # [1, 2, 2]
    draft = torch.tensor([[1, 3]])
    p = torch.softmax(
        torch.randn(1, 3, V, generator=torch.Generator().manual_seed(3)), -1
    )  # [1, 3, 6]
    for u in (0.05, 0.3, 0.6, 0.95):
        ua, us = torch.full((1, 2), u), torch.tensor([1 - u])
        outs = [
            verify_sampling(draft, torch.tensor([2]), p, qq, ua, us)
            for qq in (None, dense, (ids, probs))
        ]
        assert all(torch.equal(o.tokens, outs[0].tokens) for o in outs)


# ------------------------------------------------------------ b. seeded determinism


def _seeded_round(
    seeds: list[int], p: Tensor, q: Tensor, draft_ids: Tensor, lens: Tensor
) -> VerifyResult:
    K = draft_ids.shape[1]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    u = draw_uniforms(gens, K + 1, "cpu")  # [B, K+1]
    return verify_sampling(draft_ids, lens, p, q, u[:, :K], u[:, K])


def _random_round(B: int, K: int, V: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)  # [B, K+1, V]
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)  # [B, K, V]
    draft_ids = sample_from_probs(q.reshape(B * K, V), torch.rand(B * K, generator=g)).reshape(B, K)
    lens = torch.randint(0, K + 1, (B,), generator=g)  # [B]
    return p, q, draft_ids, lens


def test_same_seeds_same_output() -> None:
    p, q, d, lens = _random_round(16, 4, 12, seed=5)
    seeds = list(range(100, 116))
    a, b = _seeded_round(seeds, p, q, d, lens), _seeded_round(seeds, p, q, d, lens)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    c = _seeded_round([s + 1000 for s in seeds], p, q, d, lens)
    assert not torch.equal(a.tokens, c.tokens)


def test_seeded_row_does_not_depend_on_its_batch() -> None:
    p, q, d, lens = _random_round(16, 4, 12, seed=6)
    seeds = list(range(200, 216))
    full = _seeded_round(seeds, p, q, d, lens)
    for row in (0, 7, 15):
        sl = slice(row, row + 1)
        alone = _seeded_round([seeds[row]], p[sl], q[sl], d[sl], lens[sl])
        assert torch.equal(full.tokens[sl], alone.tokens)
    # Reversing the batch order permutes the output rows and nothing else.
    rev = _seeded_round(seeds[::-1], p.flip(0), q.flip(0), d.flip(0), lens.flip(0))
    assert torch.equal(rev.tokens.flip(0), full.tokens)


# -------------------------------------------------------------------- c. statistics

TRIALS = 20_000
V_STAT = 8
K_STAT = 3
SETTINGS = [  # (temperature, top_k, top_p), applied identically to p and q
    (1.0, 0, 1.0),
    (0.6, 0, 1.0),
    (1.5, 4, 1.0),
    (1.0, 0, 0.8),
    (0.8, 5, 0.9),
    (0.0, 0, 1.0),
]


def _toy(
    setting: tuple[float, int, float], q_kind: str, seed: int
) -> tuple[Tensor, DraftQ, Tensor, Tensor]:
    """p for K+1 positions and q for K, independent of the prefix, expanded over TRIALS rows.

    Returns (p [T, K+1, V], q, draft_ids [T, K], draft_lens [T]); drafts are drawn from q.
    """
    g = torch.Generator().manual_seed(seed)
    T, K, V = TRIALS, K_STAT, V_STAT
    p_pos = logits_to_probs(torch.randn(K + 1, V, generator=g) * 1.5, *setting)  # [K+1, V]
    q_pos = logits_to_probs(torch.randn(K, V, generator=g) * 1.5, *setting)  # [K, V]
    support = torch.tensor([0, 2, 3, 5, 6])  # sparse q: a strict subset of the vocabulary
    if q_kind == "sparse":
        kept = torch.zeros(V).index_fill(0, support, 1.0)  # [V]
        q_pos = q_pos * kept + 1e-3 * kept  # keep every row's mass on the support
        q_pos = q_pos / q_pos.sum(-1, keepdim=True)  # [K, V]
    if q_kind == "one_hot":
        draft_ids = q_pos.argmax(-1).expand(T, K)  # [T, K] a deterministic drafter
        q: DraftQ = None
    else:
        u = torch.rand(T, K, generator=g)  # [T, K]
        draft_ids = torch.stack(
            [sample_from_probs(q_pos[i].expand(T, V), u[:, i]) for i in range(K)], dim=1
        )  # [T, K]
        q = q_pos.expand(T, K, V)  # [T, K, V]
    if q_kind == "sparse":
        ids = torch.cat([support, torch.tensor([1])])  # [M] with one zero-probability pad id
        q = (ids.expand(T, K, -1), q_pos[:, ids].expand(T, K, -1))  # [T, K, M] twice
    lens = torch.randint(1, K + 1, (T,), generator=g)  # [T] jagged
    return p_pos.expand(T, K + 1, V), q, draft_ids, lens


def _max_excess_tv(out: VerifyResult, p: Tensor) -> float:
    """Largest (TV distance - bound) over emitted positions with enough samples."""
    worst = float("-inf")
    for i in range(p.shape[1]):
        emitted = out.num_accepted >= i  # [T] rows that emit a token at position i
        n = int(emitted.sum())
        if n < 2_000:
            continue
        empirical = torch.bincount(out.tokens[emitted, i], minlength=p.shape[2]) / n  # [V]
        tv = 0.5 * (empirical - p[0, i]).abs().sum().item()
        worst = max(worst, tv - 1.5 * (p.shape[2] / n) ** 0.5)
    return worst


Verifier = Callable[[Tensor, Tensor, Tensor, DraftQ, Tensor, Tensor], VerifyResult]


def _run(
    verify: Verifier, setting: tuple[float, int, float], q_kind: str, seed: int
) -> tuple[VerifyResult, Tensor]:
    p, q, draft_ids, lens = _toy(setting, q_kind, seed)
    g = torch.Generator().manual_seed(seed + 1)
    u = torch.rand(TRIALS, K_STAT + 1, generator=g)  # [T, K+1]
    return verify(draft_ids, lens, p, q, u[:, :K_STAT], u[:, K_STAT]), p


@pytest.mark.parametrize("q_kind", ["dense", "sparse", "one_hot"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_emitted_tokens_follow_the_target(setting: tuple[float, int, float], q_kind: str) -> None:
    out, p = _run(verify_sampling, setting, q_kind, seed=11)
    assert out.tokens[:, 0].ge(0).all()
    assert _max_excess_tv(out, p) <= 0


def _verify_sampling_seed_bug(
    draft_ids: Tensor, draft_lens: Tensor, p: Tensor, q: DraftQ, ua: Tensor, us: Tensor
) -> VerifyResult:
    """Negative control: the seed's residual max(0, p - q_j(x_j)) on every entry."""
    B, K = draft_ids.shape
    x = draft_ids
    p_x = p[:, :K].gather(2, x[..., None]).squeeze(2)  # [B, K]
    q_x = _q_of_drafts(q, x)  # [B, K]
    n = _accepted_prefix(ua * q_x < p_x, draft_lens)  # [B]
    rows = torch.arange(B)
    p_j = p[rows, n]  # [B, V]
    q_at_draft = _q_at(q, x, n.clamp(max=K - 1), p.shape[2]).gather(
        1, x[rows, n.clamp(max=K - 1)][:, None]
    )
    residual = (p_j - q_at_draft).clamp(min=0)  # [B, V] the bug: a scalar, not the q_j vector
    usable = (n < draft_lens) & (residual.sum(1) > 0)
    return _emit(draft_ids, n, sample_from_probs(torch.where(usable[:, None], residual, p_j), us))


@pytest.mark.parametrize("q_kind", ["dense", "sparse", "one_hot"])
@pytest.mark.parametrize("setting", [SETTINGS[0], SETTINGS[2], SETTINGS[3]])
def test_statistical_check_catches_the_seed_residual_bug(
    setting: tuple[float, int, float], q_kind: str
) -> None:
    out, p = _run(_verify_sampling_seed_bug, setting, q_kind, seed=11)
    assert _max_excess_tv(out, p) > 0
