"""The cost model: measured forward and draft prices, driven by simulated timings (no clocks)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from draftgate.engine.costs import CostModel


def linear(n: int) -> float:
    return 1.0 + 0.1 * (n - 1)


def timed(curve: Callable[[int], float], sizes: range | list[int] = range(1, 10), times: int = 5) -> CostModel:
    """A cost model that has timed each of ``sizes`` ``times`` times on ``curve``."""
    cost = CostModel()
    for _ in range(times):
        for n in sizes:
            cost.observe_forward(n, curve(n))
    return cost


def test_cost_prior_before_any_measurement() -> None:
    cost = CostModel()
    assert cost.forward_time(1) == 1.0
    assert cost.forward_time(5) == pytest.approx(2.0)
    assert not cost.measured(1)
    assert cost.draft_time("ngram", 4) == 0.0


def test_cost_window_median_per_bucket() -> None:
    cost = CostModel(window=5)
    cost.observe_forward(4, 1.0)
    assert cost.forward_time(4) == 1.0
    cost.observe_forward(4, 2.0)
    assert cost.forward_time(4) == pytest.approx(1.5)
    assert cost.measured(4) and not cost.measured(3)
    for t in (1.0, 1.0, 9.0):  # one slow step (another process) does not move the estimate
        cost.observe_forward(4, t)
    assert cost.forward_time(4) == 1.0
    for _ in range(5):  # a lasting change does, within one window
        cost.observe_forward(4, 3.0)
    assert cost.forward_time(4) == 3.0
    with pytest.raises(ValueError):
        CostModel(window=0)


def test_cost_interpolation_extrapolation_and_optimism() -> None:
    cost = timed(lambda n: {1: 1.0, 5: 2.0}[n], [1, 5])
    assert cost.forward_time(3) == pytest.approx(1.5)  # between measured buckets
    assert cost.forward_time(9) == pytest.approx(3.0)  # fitted line a + b*n, b = 0.25
    # optimistic: an unmeasured size is as cheap as the cheapest measured smaller one
    assert cost.forward_time(3, optimistic=True) == 1.0
    assert cost.forward_time(9, optimistic=True) == 1.0
    assert cost.forward_time(5, optimistic=True) == 2.0  # measured sizes are never guessed

    only4 = timed(lambda n: 2.0, [4])
    assert only4.forward_time(1) == pytest.approx(2.0 / 1.75)  # the prior's shape
    assert only4.forward_time(1, optimistic=True) == pytest.approx(0.5)  # proportional
    assert only4.forward_time(8) == pytest.approx(2.0 + 4 * 2.0 * 0.25 / 1.75)


def test_cost_coarse_buckets_above_64_tokens() -> None:
    cost = CostModel()
    cost.observe_forward(100, 10.0)
    assert cost.measured(100) and cost.measured(104)  # same coarse bucket
    assert cost.forward_time(100) == pytest.approx(10.0)
    assert cost.forward_time(104) == pytest.approx(10.4)  # proportional inside the bucket
    assert not cost.measured(300)


def test_cost_draft_overhead_plus_per_token() -> None:
    cost = CostModel()
    for _ in range(5):
        for n in (1, 4, 8):
            cost.observe_draft("model", n, 0.2 + 0.1 * n)
    assert cost.draft_time("model", 5) == pytest.approx(0.7)
    assert cost.draft_time("model", 0) == 0.0
    single = CostModel()
    single.observe_draft("model", 4, 0.8)  # one size only: taken as per-token cost
    assert single.draft_time("model", 2) == pytest.approx(0.4)
    assert single.draft_time("other", 2) == 0.0


def test_cost_draft_outlier_does_not_price_drafting_out() -> None:
    """auto drafts by lookup (~0.1 ms) until its model draft first prefills the prompt (~0.5 s)."""
    cost = CostModel(window=15)
    for _ in range(10):
        cost.observe_draft("auto", 8, 0.0001)
    cost.observe_draft("auto", 8, 0.6)
    assert cost.draft_time("auto", 8) == pytest.approx(0.0001)
    cost.observe_draft("auto", 1, 0.6)  # a lone slow call at another size
    assert cost.draft_time("auto", 4) < 0.6


@pytest.mark.parametrize(("n", "seconds"), [(0, 1.0), (1, -1.0), (1, math.nan), (1, math.inf)])
def test_cost_rejects_bad_observations(n: int, seconds: float) -> None:
    with pytest.raises(ValueError):
        CostModel().observe_forward(n, seconds)
    with pytest.raises(ValueError):
        CostModel().observe_draft("d", n - 1, seconds)


def test_cost_branch_rows_priced_at_the_measured_slope() -> None:
    cost = timed(linear)
    assert cost.round_forward_time("head", 3) == pytest.approx(linear(3))  # no branch observed yet
    for extra in (2, 0, 2, 0):
        cost.observe_branch("head", extra)
    assert cost.branch_rows("head") == pytest.approx(1.0)
    assert cost.round_forward_time("head", 3) == pytest.approx(linear(3) + 1.0 * 0.1)  # one row's slope
    assert cost.round_forward_time("lookup", 3) == pytest.approx(linear(3))  # per drafter
    with pytest.raises(ValueError):
        cost.observe_branch("head", -1)


def test_catch_up_cost_is_a_median_per_token_and_zero_before_any_call() -> None:
    cost = CostModel()
    assert cost.catch_up_time("m", 100) == 0.0
    for seconds in (1.0, 1.2, 0.8, 50.0):  # per 100 tokens; one outlier (a GC pause)
        cost.observe_catch_up("m", 100, seconds)
    assert cost.catch_up_time("m", 10) == pytest.approx(0.11)
    cost.observe_catch_up("m", 5, -1.0)  # below the steady-state estimate: counts as free
    assert cost.catch_up_time("other", 10) == 0.0
    with pytest.raises(ValueError):
        cost.observe_catch_up("m", 0, 1.0)


def test_catch_up_price_weighs_each_call_by_its_tokens() -> None:
    """Calls that caught up on a token or two are noise over a tiny denominator: a prompt's
    catch-up outweighs them (the head's: 0.03 ms a token, 3 ms "a token" after one plain round)."""
    cost = CostModel()
    cost.observe_catch_up("head", 50, 50 * 3e-5)  # a prompt
    for _ in range(4):
        cost.observe_catch_up("head", 1, 3e-3)  # a plain round's token, inside the timing noise
    assert cost.catch_up_time("head", 50) == pytest.approx(50 * 3e-5)
    for _ in range(60):  # only the window's calls count: the prompt's ages out
        cost.observe_catch_up("head", 1, 3e-3)
    assert cost.catch_up_time("head", 50) == pytest.approx(50 * 3e-3)
