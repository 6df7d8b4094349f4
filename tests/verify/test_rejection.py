"""Tests for draftgate.verify.rejection, at three levels (as vLLM's rejection sampler tests):

a. exact tables: hand-written greedy and sampling cases with known outputs;
b. seeded determinism: per-row generators make a row independent of its batch;
c. statistics: 300k trials in the batch dimension, a chi-square test at a fixed
   significance level per emitted position and for the bonus tokens alone; draft
   lengths are weighted so every cell has tens of thousands of samples. Five planted
   broken verifiers are the negative controls: each must fail by >= 3x the threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from draftgate.sampling import draw_uniforms, logits_to_probs, sample_from_probs
from draftgate.verify import VerifyResult, verify_greedy, verify_sampling
from draftgate.verify.fidelity import ChiSquare, chi_square_fit
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
def test_greedy_table(drafts: list[int], argmax: list[int], tokens: list[int], accepted: int) -> None:
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
        torch.tensor([[1]]), torch.tensor([1]), p, p[:, :1], torch.tensor([[0.999]]), torch.tensor([0.3])
    )
    assert out.tokens.tolist() == [[1, 2]]
    # Forced rejection of a token with p == 0 (q sent nonsense): residual = p - q = 0 -> sample p.
    p0 = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])  # [1, 2, 3]
    out = verify_sampling(
        torch.tensor([[0]]), torch.tensor([1]), p0, p0[:, :1], torch.tensor([[0.0]]), torch.tensor([0.5])
    )
    assert out.tokens.tolist() == [[1, -1]]


def test_sparse_and_dense_and_one_hot_q_agree() -> None:
    V = 6
    dense = torch.tensor([[[0.0, 1.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]]])  # [1, 2, 6]
    ids = torch.tensor([[[1, 0], [3, 0]]])  # [1, 2, 2] padded with a zero-probability id
    probs = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])  # [1, 2, 2]
    draft = torch.tensor([[1, 3]])
    p = torch.softmax(torch.randn(1, 3, V, generator=torch.Generator().manual_seed(3)), -1)  # [1, 3, 6]
    for u in (0.05, 0.3, 0.6, 0.95):
        ua, us = torch.full((1, 2), u), torch.tensor([1 - u])
        outs = [verify_sampling(draft, torch.tensor([2]), p, qq, ua, us) for qq in (None, dense, (ids, probs))]
        assert all(torch.equal(o.tokens, outs[0].tokens) for o in outs)


# ------------------------------------------------------------ b. seeded determinism


def _seeded_round(seeds: list[int], p: Tensor, q: Tensor, draft_ids: Tensor, lens: Tensor) -> VerifyResult:
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

TRIALS = 300_000
V_STAT = 6
K_STAT = 3
LEN_WEIGHTS = [0.04, 0.16, 0.25, 0.55]  # P(k_b = 0..K): bonus cells at every position get >= ~15k rows
ALPHA = 1e-3  # for the whole test: split over its cells (Bonferroni)
MARGIN = 3.0  # a negative control's worst cell must exceed the threshold by this factor
Setting = tuple[float, int, float]  # (temperature, top_k, top_p), applied to p and q alike
SETTINGS: list[Setting] = [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.5, 4, 1.0), (1.0, 0, 0.8), (0.8, 5, 0.9), (0.0, 0, 1.0)]


@dataclass(frozen=True)
class Toy:
    """p for K+1 positions and q for K, independent of the prefix, expanded over TRIALS rows."""

    p: Tensor  # [T, K+1, V] target after the setting's transforms
    q: DraftQ  # what the drafter reports: exactly the distribution its drafts came from
    q_logits: Tensor  # [K, V] the drafter's logits (for controls that transform them wrongly)
    draft_ids: Tensor  # [T, K] drawn from q
    lens: Tensor  # [T] jagged, drawn with LEN_WEIGHTS


def _toy(setting: Setting, q_kind: str, seed: int) -> Toy:
    g = torch.Generator().manual_seed(seed)
    T, K, V = TRIALS, K_STAT, V_STAT
    p_logits = torch.randn(K + 1, V, generator=g) * 1.2  # [K+1, V]
    p_pos = logits_to_probs(p_logits, *setting)  # [K+1, V]
    # A fair drafter: q near p (acceptance ~0.6-0.8), so the deep positions get their samples.
    q_logits = p_logits[:K] + torch.randn(K, V, generator=g) * 0.7  # [K, V]
    q_pos = logits_to_probs(q_logits, *setting)  # [K, V]
    support = q_pos.topk(4, dim=-1).indices  # [K, 4] sparse q: its top 4 (a strict subset of V)
    if q_kind == "sparse":
        kept = torch.zeros(K, V).scatter_(1, support, 1.0)  # [K, V]
        q_pos = q_pos * kept + 1e-3 * kept  # keep every row's mass on the support
        q_pos = q_pos / q_pos.sum(-1, keepdim=True)  # [K, V]
    if q_kind == "one_hot":
        draft_ids = q_pos.argmax(-1).expand(T, K)  # [T, K] a deterministic drafter
        q: DraftQ = None
    else:
        u = torch.rand(T, K, generator=g)  # [T, K]
        draft_ids = torch.stack([sample_from_probs(q_pos[i].expand(T, V), u[:, i]) for i in range(K)], dim=1)  # [T, K]
        q = q_pos.expand(T, K, V)  # [T, K, V]
    if q_kind == "sparse":
        pad = q_pos.argmin(-1, keepdim=True)  # [K, 1] a zero-probability id, as senders pad
        ids = torch.cat([support, pad], dim=1)  # [K, M]
        q = (ids.expand(T, K, -1), q_pos.gather(1, ids).expand(T, K, -1))  # [T, K, M] twice
    lens = torch.multinomial(torch.tensor(LEN_WEIGHTS), T, replacement=True, generator=g)  # [T]
    return Toy(p_pos.expand(T, K + 1, V), q, q_logits, draft_ids, lens)


def _cells(out: VerifyResult, toy: Toy) -> dict[str, ChiSquare]:
    """One chi-square test per cell: every token emitted at position i, and the bonus tokens at i."""
    K = toy.draft_ids.shape[1]
    masks = {f"pos{i}": out.num_accepted >= i for i in range(K + 1)}  # [T] rows emitting at i
    masks |= {f"bonus{i}": (toy.lens == i) & (out.num_accepted == i) for i in range(1, K + 1)}
    alpha = ALPHA / len(masks)
    cells = {}
    for name, rows in masks.items():
        i = int(name[-1])
        counts = torch.bincount(out.tokens[rows, i], minlength=toy.p.shape[2])  # [V]
        cells[name] = chi_square_fit(counts, toy.p[0, i], alpha)
    return cells


Verifier = Callable[[Toy, Tensor, Tensor], VerifyResult]  # (toy, u_accept [T, K], u_sample [T])


def _run(verify: Verifier, setting: Setting, q_kind: str, seed: int) -> dict[str, ChiSquare]:
    toy = _toy(setting, q_kind, seed)
    u = torch.rand(TRIALS, K_STAT + 1, generator=torch.Generator().manual_seed(seed + 1))  # [T, K+1]
    return _cells(verify(toy, u[:, :K_STAT], u[:, K_STAT]), toy)


def _real(toy: Toy, ua: Tensor, us: Tensor) -> VerifyResult:
    return verify_sampling(toy.draft_ids, toy.lens, toy.p, toy.q, ua, us)


@pytest.mark.parametrize("q_kind", ["dense", "sparse", "one_hot"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_emitted_tokens_follow_the_target(setting: Setting, q_kind: str) -> None:
    cells = _run(_real, setting, q_kind, seed=11)
    for name, c in cells.items():
        assert c.n >= 10_000 or c.dof == 0, f"{name}: only {c.n} samples"
        assert c.passed, f"{name}: chi-square {c.statistic:.1f} > {c.threshold:.1f} (dof {c.dof})"


# --- negative controls: planted broken verifiers the same test must catch.


def _broken(
    toy: Toy,
    ua: Tensor,
    us: Tensor,
    residual_of: Callable[[Tensor, Tensor, Tensor], Tensor],
    bonus_of: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> VerifyResult:
    """verify_sampling with its residual (p_j [B, V], q_j [B, V], q_j(x_j) [B, 1] -> [B, V]) or
    its bonus distribution (p_j, q_j -> [B, V]) replaced."""
    x, lens, p, q = toy.draft_ids, toy.lens, toy.p, toy.q
    B, K = x.shape
    p_x = p[:, :K].gather(2, x[..., None]).squeeze(2)  # [B, K]
    n = _accepted_prefix(ua * _q_of_drafts(q, x) < p_x, lens)  # [B]
    rows = torch.arange(B)
    j = n.clamp(max=K - 1)  # [B]
    p_j, q_j = p[rows, n], _q_at(q, x, j, p.shape[2])  # [B, V] twice
    residual = residual_of(p_j, q_j, q_j.gather(1, x[rows, j][:, None])).clamp(min=0)  # [B, V]
    usable = (n < lens) & (residual.sum(1) > 0)  # [B]
    bonus = bonus_of(p_j, q_j) if bonus_of is not None else p_j  # [B, V]
    dist = torch.where(usable[:, None], residual, torch.where((n < lens)[:, None], p_j, bonus))  # [B, V]
    return _emit(x, n, sample_from_probs(dist, us))


def _seed_residual(toy: Toy, ua: Tensor, us: Tensor) -> VerifyResult:
    """The seeds' bug: max(0, p - q_j(x_j)), a scalar where the q_j vector belongs."""
    return _broken(toy, ua, us, lambda p, q, q_x: p - q_x)


def _residual_09(toy: Toy, ua: Tensor, us: Tensor) -> VerifyResult:
    """max(0, p - 0.9 q): a small error (0.006-0.012 TV), the kind a loose test lets through."""
    return _broken(toy, ua, us, lambda p, q, q_x: p - 0.9 * q)


def _bonus_from_q(toy: Toy, ua: Tensor, us: Tensor) -> VerifyResult:
    """The bonus drawn from the draft's q at that position instead of the target's p."""
    return _broken(toy, ua, us, lambda p, q, q_x: p - q, bonus_of=lambda p, q: q)


def _wrong_q(setting: Setting) -> Verifier:
    """The verifier is told a q with only part of the request's transforms (the drafts came from
    the fully transformed one): the transform was applied to p only."""

    def verify(toy: Toy, ua: Tensor, us: Tensor) -> VerifyResult:
        q = logits_to_probs(toy.q_logits, *setting).expand_as(toy.p[:, 1:])  # [T, K, V]
        return verify_sampling(toy.draft_ids, toy.lens, toy.p, q, ua, us)

    return verify


CONTROLS: list[tuple[str, Verifier, Setting, list[str]]] = [
    ("seed residual", _seed_residual, SETTINGS[0], ["dense", "sparse", "one_hot"]),
    ("seed residual", _seed_residual, SETTINGS[3], ["dense", "sparse", "one_hot"]),
    # (with a one-hot q, 0.9q only differs where p(x) > 0.9: no bias to find)
    ("max(0, p - 0.9q)", _residual_09, SETTINGS[0], ["dense", "sparse"]),
    ("max(0, p - 0.9q)", _residual_09, SETTINGS[2], ["dense", "sparse"]),
    ("bonus from q", _bonus_from_q, SETTINGS[0], ["dense", "sparse", "one_hot"]),
    ("bonus from q", _bonus_from_q, SETTINGS[4], ["dense", "sparse", "one_hot"]),
    ("top-p on p only", _wrong_q((1.0, 0, 1.0)), (1.0, 0, 0.8), ["dense"]),
    ("temperature on p only", _wrong_q((1.0, 0, 1.0)), (0.6, 0, 1.0), ["dense"]),
]


@pytest.mark.parametrize(
    ("name", "verify", "setting", "q_kind"),
    [(n, v, s, k) for n, v, s, kinds in CONTROLS for k in kinds],
    ids=lambda x: x.replace(" ", "_") if isinstance(x, str) else None,
)
def test_the_statistical_test_catches_each_planted_verifier_bug(
    name: str, verify: Verifier, setting: Setting, q_kind: str
) -> None:
    cells = _run(verify, setting, q_kind, seed=11)
    worst = max(cells, key=lambda c: cells[c].ratio)
    assert cells[worst].ratio >= MARGIN, f"{name}: worst cell {worst} is only {cells[worst].ratio:.2f}x its threshold"
