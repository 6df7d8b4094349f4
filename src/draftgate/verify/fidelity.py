"""Chi-square tests that emitted tokens follow the target: the statistics behind "lossless".

Two questions, both at a fixed significance level alpha:

- goodness of fit: do ``counts [V]`` come from the known distribution ``p [V]``? (the verifier
  tests: p is the table the verifier was given);
- homogeneity: do two samples ``counts_a [V]``, ``counts_b [V]`` come from one distribution?
  (``check-lossless`` end to end: speculative vs plain sampling through a back end whose p we
  cannot see).

Tokens whose expected count is below ``MIN_EXPECTED`` share bins (the least likely pooled
together until each bin holds that much), as the test's asymptotics need; a test with fewer
than two bins left has nothing to say and passes with dof 0. Pure math on counts: no model, no randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ChiSquare", "chi_square_fit", "chi_square_homogeneity", "chi_square_threshold", "positional_homogeneity"]

MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    threshold: float  # the (1 - alpha) quantile of chi-square with dof degrees of freedom
    p_value: float
    n: int  # samples (both samples together for homogeneity)

    @property
    def passed(self) -> bool:
        return self.statistic <= self.threshold

    @property
    def ratio(self) -> float:
        """statistic / threshold: > 1 fails; a negative control should sit far above 1."""
        return self.statistic / self.threshold if self.threshold > 0 else 0.0


def _sf(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square(dof)."""
    return float(
        torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64))
    )


def chi_square_threshold(dof: int, alpha: float) -> float:
    """The x with P(chi-square(dof) > x) = alpha, by bisection on the survival function."""
    assert dof >= 1 and 0 < alpha < 1
    lo, hi = 0.0, float(dof)
    while _sf(hi, dof) > alpha:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _sf(mid, dof) > alpha else (lo, mid)
    return hi


def _result(stat: float, dof: int, alpha: float, n: int) -> ChiSquare:
    if dof < 1:
        return ChiSquare(0.0, 0, 0.0, 1.0, n)
    return ChiSquare(stat, dof, chi_square_threshold(dof, alpha), _sf(stat, dof), n)


def _pool(expected: Tensor) -> Tensor:
    """Bin index per entry [V]: from the most expected down, entries share a bin until it holds
    ``MIN_EXPECTED``; a short tail joins the last bin. Entries with nothing expected get -1."""
    order = expected.argsort(descending=True).tolist()
    bins = torch.full_like(expected, -1, dtype=torch.long)  # [V]
    b, mass = 0, 0.0
    for i in order:
        e = float(expected[i])
        if e <= 0:
            break
        bins[i] = b
        mass += e
        if mass >= MIN_EXPECTED:
            b, mass = b + 1, 0.0
    if 0 < mass < MIN_EXPECTED and b > 0:  # the tail is short: fold it into the bin before
        bins[bins == b] = b - 1
    return bins  # [V]


def _binned(values: Tensor, bins: Tensor) -> Tensor:
    nb = int(bins.max()) + 1 if bins.numel() else 0
    keep = bins >= 0
    return torch.zeros(max(nb, 0), dtype=torch.float64).index_add_(0, bins[keep], values[keep])  # [nb]


def chi_square_fit(counts: Tensor, p: Tensor, alpha: float) -> ChiSquare:
    """Goodness of fit of ``counts [V]`` (int) to ``p [V]`` (sums to 1)."""
    counts, p = counts.double(), p.double() / p.double().sum()
    n = int(counts.sum())
    if n == 0:
        return _result(0.0, 0, alpha, 0)
    outside = float(counts[p <= 0].sum())
    if outside > 0:  # a token the target gives probability 0: no test statistic needed
        return ChiSquare(float("inf"), 1, chi_square_threshold(1, alpha), 0.0, n)
    expected = n * p  # [V]
    bins = _pool(expected)
    e, o = _binned(expected, bins), _binned(counts, bins)  # [nb] twice
    stat = float(((o - e) ** 2 / e).sum())
    return _result(stat, e.numel() - 1, alpha, n)


def chi_square_homogeneity(counts_a: Tensor, counts_b: Tensor, alpha: float) -> ChiSquare:
    """Do ``counts_a [V]`` and ``counts_b [V]`` come from one distribution? (2 x V contingency)."""
    a, b = counts_a.double(), counts_b.double()
    na, nb_ = float(a.sum()), float(b.sum())
    n = int(na + nb_)
    if na == 0 or nb_ == 0:
        return _result(0.0, 0, alpha, n)
    total = a + b  # [V]
    bins = _pool(total * min(na, nb_) / n)  # pool by the smaller sample's expected count
    oa, ob = _binned(a, bins), _binned(b, bins)  # [k] twice
    t = oa + ob
    ea, eb = t * na / n, t * nb_ / n
    stat = float(((oa - ea) ** 2 / ea).sum() + ((ob - eb) ** 2 / eb).sum())
    return _result(stat, t.numel() - 1, alpha, n)


def positional_homogeneity(
    a: Sequence[Sequence[int]], b: Sequence[Sequence[int]], positions: int, alpha: float
) -> list[ChiSquare]:
    """One homogeneity test per output position of two sets of sampled outputs (token ids per
    sample), each at ``alpha / positions`` (Bonferroni: the family holds ``alpha``)."""
    V = 1 + max((t for o in (*a, *b) for t in o), default=0)
    out = []
    for i in range(positions):
        ca = torch.bincount(torch.tensor([o[i] for o in a if len(o) > i], dtype=torch.long), minlength=V)  # [V]
        cb = torch.bincount(torch.tensor([o[i] for o in b if len(o) > i], dtype=torch.long), minlength=V)  # [V]
        out.append(chi_square_homogeneity(ca, cb, alpha / positions))
    return out
