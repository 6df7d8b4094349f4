"""Adaptive K controller, driven by simulated acceptance and simulated costs (no clocks)."""

from __future__ import annotations

import random
from collections.abc import Callable
from fractions import Fraction

import pytest

from draftgate.engine.acceptance import AcceptancePool, AcceptanceTracker
from draftgate.engine.controller import DOWN_PROBE_EVERY, EXPLORE, FEW_CATCH_UPS, FEW_PLAIN_TIMINGS, GoodputController
from draftgate.engine.costs import CATCH_UP_RETRY, STALE_AFTER, CostModel

K_MAX = 8


def linear(n: int) -> float:
    return 1.0 + 0.1 * (n - 1)


# feasibility.md §2 (fp32 HF on AVX2): 2-3 row forwards cost more than 5 row ones.
_FEAS_POINTS = {1: 1.0, 2: 1.8, 3: 2.4, 5: 1.8, 9: 2.0}


def feasibility(n: int) -> float:
    if n in _FEAS_POINTS:
        return _FEAS_POINTS[n]
    lo = max(p for p in _FEAS_POINTS if p < n)
    hi = min(p for p in _FEAS_POINTS if p > n)
    return _FEAS_POINTS[lo] + (_FEAS_POINTS[hi] - _FEAS_POINTS[lo]) * (n - lo) / (hi - lo)


def measured(curve: Callable[[int], float], sizes: range | list[int] = range(1, K_MAX + 2)) -> CostModel:
    """A cost model that has timed every size enough (down-probes then come every DOWN_PROBE_EVERY)."""
    cost = CostModel()
    for _ in range(FEW_PLAIN_TIMINGS):
        for n in sizes:
            cost.observe_forward(n, curve(n))
    return cost


def accepted_count(rng: random.Random, k: int, alpha: float) -> int:
    a = 0
    while a < k and rng.random() < alpha:
        a += 1
    return a


def simulate(
    alpha: float | Callable[[int], float],
    curve: Callable[[int], float],
    rounds: int,
    seed: int,
    ctl: GoodputController | None = None,
    cost: CostModel | None = None,
    draft: Callable[[int], float] | None = None,
) -> tuple[float, list[int], GoodputController]:
    """Run the controller against a Bernoulli acceptance simulator; returns goodput and the Ks."""
    rng = random.Random(seed)
    ctl = ctl or GoodputController(K_MAX, "sim")
    cost = cost or CostModel()
    tokens, seconds, ks = 0, 0.0, []
    for r in range(rounds):
        k = ctl.choose_k(cost)
        assert 0 <= k <= ctl.k_max
        a = accepted_count(rng, k, alpha(r) if callable(alpha) else alpha)
        dt = curve(k + 1)
        cost.observe_forward(k + 1, dt)
        if draft is not None and k:
            cost.observe_draft("sim", k, draft(k))
            dt += draft(k)
        ctl.record(k, a)
        tokens, seconds = tokens + a + 1, seconds + dt
        ks.append(k)
    return tokens / seconds, ks, ctl


def fixed_goodput(alpha: float, curve: Callable[[int], float], k: int, draft=None) -> float:
    expected = sum(alpha**j for j in range(k + 1))
    return expected / (curve(k + 1) + (draft(k) if draft and k else 0.0))


# --- AcceptanceTracker -----------------------------------------------------------------------


def test_tracker_prior_and_k0() -> None:
    t = AcceptanceTracker(3)
    assert t.alphas() == [0.5, 0.5, 0.5]
    assert t.expected_tokens(0) == 1.0
    assert t.expected_tokens(2) == pytest.approx(1.75)


def test_tracker_expected_tokens_exact() -> None:
    t = AcceptanceTracker(3)
    t.record(3, 1)  # position 1 accepted, position 2 rejected, position 3 never reached
    a1 = Fraction(1 + 1, 1 + 2)
    a2 = Fraction(0 + 2 * a1, 1 + 2)
    a3 = Fraction(0 + 2 * a2, 0 + 2)  # unreached: inherits position 2
    assert t.alphas() == pytest.approx([float(a1), float(a2), float(a3)])
    exact = 1 + a1 + a1 * a2 + a1 * a2 * a3
    assert t.expected_tokens(3) == pytest.approx(float(exact))

    t.record(2, 2)  # both accepted; nothing rejected
    b1 = Fraction(2 + 1, 2 + 2)
    b2 = Fraction(1 + 2 * b1, 2 + 2)
    assert t.alphas(2) == pytest.approx([float(b1), float(b2)])
    assert t.expected_tokens(2) == pytest.approx(float(1 + b1 + b1 * b2))
    assert t.prob_at_least(2) == pytest.approx(float(b1 * b2))
    assert t.prob_at_least(0) == 1.0


def test_tracker_window_forgets_old_rounds() -> None:
    t = AcceptanceTracker(1, window=2)
    for k, a in [(1, 0), (1, 0), (1, 1), (1, 1)]:
        t.record(k, a)
    assert len(t) == 2
    assert t.alphas() == pytest.approx([(2 + 1) / (2 + 2)])  # only the last two rounds count
    for _ in range(1000):
        t.record(1, 0)
    assert len(t) == 2
    assert t.alphas() == pytest.approx([1 / 4])
    t.clear()
    assert len(t) == 0 and t.alphas() == [0.5]


def test_tracker_optimistic_alphas_are_wider_with_less_data() -> None:
    few, many = AcceptanceTracker(1), AcceptanceTracker(1)
    for t, n in ((few, 4), (many, 60)):
        for i in range(n):
            t.record(1, int(i % 4 == 0))
    assert few.alphas(z=1.5)[0] - few.alphas()[0] > many.alphas(z=1.5)[0] - many.alphas()[0] > 0


@pytest.mark.parametrize(
    "kwargs",
    [{"k_max": -1}, {"k_max": 4, "window": 0}, {"k_max": 4, "prior_alpha": 1.5}, {"k_max": 4, "prior_weight": 0.0}],
)
def test_tracker_validates(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AcceptanceTracker(**kwargs)


def test_tracker_rejects_bad_records() -> None:
    t = AcceptanceTracker(4)
    for k, a in [(5, 0), (-1, 0), (2, 3), (2, -1)]:
        with pytest.raises(ValueError):
            t.record(k, a)
    with pytest.raises(ValueError):
        t.expected_tokens(5)
    t.record(0, 0)  # a round without drafts carries no information
    assert len(t) == 0


# --- GoodputController -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k_max": -1},
        {"k_max": 4, "window": 0},
        {"k_max": 4, "probe_interval": 0},
        {"k_max": 4, "probe_interval": 16, "max_probe_interval": 8},
        {"k_max": 4, "probe_k": 5},
        {"k_max": 4, "probe_k": 0},
    ],
)
def test_controller_validates(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        GoodputController(drafter="d", **kwargs)
    with pytest.raises(ValueError):
        GoodputController(4, "d").choose_k(CostModel(), other_tokens=-1)


def test_high_acceptance_chooses_large_k() -> None:
    _, ks, ctl = simulate(0.9, linear, 600, seed=1, cost=measured(linear))
    tail = sorted(ks[100:])
    assert tail[len(tail) // 2] >= 6
    assert ks[100:].count(0) == ctl.down_probes - ks[:100].count(0)  # plain only to re-measure it
    assert ks[100:].count(0) <= len(ks[100:]) // DOWN_PROBE_EVERY + 1
    snap = ctl.snapshot()
    assert snap["last_k"] == ks[-1] and snap["window_rounds"] == 64
    assert all(0.7 < a <= 1.0 for a in snap["alphas"][:4])


def test_zero_acceptance_settles_then_probes_with_backoff() -> None:
    ctl = GoodputController(K_MAX, "sim", probe_interval=8, max_probe_interval=128, probe_k=K_MAX)
    _, ks, ctl = simulate(0.0, linear, 3000, seed=2, ctl=ctl, cost=measured(linear))
    first_zero = ks.index(0)
    assert first_zero <= 30
    probes = [i for i, k in enumerate(ks) if k > 0 and i > first_zero]
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    for i, gap in zip(probes[1:], gaps, strict=True):  # each probe paid for by the plain rounds before it
        assert linear(ks[i] + 1) - linear(1) <= EXPLORE * (gap - 1) * linear(1) + 1e-9
    assert [ks[i] for i in probes[-3:]] == [K_MAX] * 3  # at the longest back-off: probe_k, affordable
    assert gaps[:4] == [17, 33, 65, 129] and set(gaps[4:]) == {
        129
    }  # the back-off doubles, capped at max_probe_interval
    snap = ctl.snapshot()
    assert snap["interval"] == 128 and 0 <= snap["zero_run"] <= 128
    assert snap["window_rounds"] <= 64


@pytest.mark.parametrize("seed", range(5))
def test_low_acceptance_settles_to_zero(seed: int) -> None:
    _, ks, ctl = simulate(0.05, feasibility, 3000, seed, cost=measured(feasibility))
    assert 0 in ks[:200]
    late = ks[1000:]
    assert sum(k > 0 for k in late) < 0.05 * len(late)  # speculation only to probe
    assert ctl.interval > ctl.probe_interval


@pytest.mark.parametrize("seed", range(6))
def test_speculation_resumes_after_long_zero_stretch(seed: int) -> None:
    switch = 3000
    _, ks, ctl = simulate(lambda r: 0.05 if r < switch else 0.9, linear, switch + 600, seed, cost=measured(linear))
    assert sum(k > 0 for k in ks[switch - 1000 : switch]) < 100  # was plain decoding
    # the window is stale: at most ~3 probes at the longest back-off, then K >= 3 sustained
    limit = 3 * ctl.max_probe_interval + 50
    resumed = next(i for i in range(switch, len(ks) - 20) if all(k >= 3 for k in ks[i : i + 20]))
    assert resumed - switch <= limit
    assert ctl.interval == ctl.probe_interval  # speculation won: back-off reset


def test_surprising_probe_discards_the_stale_window() -> None:
    cost = measured(linear)
    ctl = GoodputController(K_MAX, "sim", probe_interval=4, probe_k=K_MAX)
    _, ks, ctl = simulate(0.0, linear, 400, seed=3, ctl=ctl, cost=cost)
    assert ks[-1] == 0 and len(ctl.tracker) > 10
    while (k := ctl.choose_k(cost)) == 0:
        pass
    assert k == K_MAX
    ctl.record(k, K_MAX)  # a full acceptance: P < 1% under the window
    assert len(ctl.tracker) == 1
    assert ctl.choose_k(cost) >= 3


def test_nonmonotone_costs_never_pick_one_or_two() -> None:
    """feasibility.md: k=4 (5 rows) costs as much as k=1 (2 rows) and less than k=2 (3 rows)."""
    for alpha in (0.3, 0.5, 0.6, 0.7, 0.9, 1.0):
        cost = measured(feasibility, [1, 2, 3, 5, 9])  # 4, 6..8 are learned while running
        _, ks, _ = simulate(alpha, feasibility, 400, seed=4, cost=cost)
        assert not {1, 2} & set(ks), (alpha, sorted(set(ks)))


def test_marginal_view_uses_other_tokens() -> None:
    """Compute-bound forward (time = tokens): alone, speculation never pays; in a big batch
    the request's own K tokens add little to the shared step, so it does."""
    cost = measured(lambda n: float(n), range(1, 120))
    ctl = GoodputController(4, "sim")
    for _ in range(64):
        ctl.record(4, 3)
    assert ctl.choose_k(cost, other_tokens=0) == 0
    assert ctl.choose_k(cost, other_tokens=100) > 0


def test_expensive_drafter_turns_speculation_off() -> None:
    draft = lambda k: 0.5 * k  # noqa: E731
    _, ks, _ = simulate(0.6, linear, 500, seed=5, cost=measured(linear), draft=draft)
    assert sum(k > 0 for k in ks[200:]) < 30


def _branching(alpha: float, priced: bool, rounds: int = 600) -> tuple[float, list[int]]:
    """Every drafted round also runs a two-row sibling branch (as eagle's do), timed at its true size."""
    rng, ctl, cost = random.Random(3), GoodputController(K_MAX, "sim"), measured(linear)
    tokens, seconds, ks = 0, 0.0, []
    for _ in range(rounds):
        k = ctl.choose_k(cost)
        rows = k + 1 + (2 if k else 0)
        cost.observe_forward(rows, linear(rows))
        if k and priced:
            cost.observe_branch("sim", 2)
        a = accepted_count(rng, k, alpha)
        ctl.record(k, a)
        tokens, seconds = tokens + a + 1, seconds + linear(rows)
        ks.append(k)
    return tokens / seconds, ks


def test_branch_rows_priced_keep_a_losing_draft_off() -> None:
    """alpha 0.2 at 0.1 a row: K = 1 looks like 1.2 / 1.1 of plain by its own rows, and is 1.2 / 1.3
    with the branch's two; priced by K + 1 rows alone the controller drafts at a loss (the control)."""
    plain = 1.0 / linear(1)
    good, ks = _branching(0.2, priced=True)
    assert good >= 0.97 * plain and sum(k > 0 for k in ks[200:]) < 40
    bad, _ = _branching(0.2, priced=False)
    assert bad < 0.95 * plain


def test_k_max_zero_and_one() -> None:
    cost = measured(linear)
    zero = GoodputController(0, "sim")
    assert [zero.choose_k(cost) for _ in range(300)] == [0] * 300
    zero.record(0, 0)
    assert zero.snapshot()["probes"] == 0

    _, ks, one = simulate(0.0, linear, 500, seed=6, ctl=GoodputController(1, "sim"), cost=cost)
    assert set(ks) == {0, 1} and ks[-50:].count(1) <= 1
    _, ks, ctl = simulate(1.0, linear, 200, seed=6, ctl=GoodputController(1, "sim"), cost=cost)
    assert set(ks[5:]) <= {0, 1} and ks[5:].count(0) == ctl.down_probes <= 2


def test_controller_is_deterministic() -> None:
    a = simulate(0.5, feasibility, 500, seed=7)[1]
    b = simulate(0.5, feasibility, 500, seed=7)[1]
    assert a == b


@pytest.mark.parametrize(
    ("curve", "alpha", "draft"),
    [
        (linear, 0.05, None),  # low: plain decoding wins
        (linear, 0.4, None),  # mid
        (linear, 0.9, None),  # high
        (feasibility, 0.3, None),  # low on the CPU curve (K = 4 loses 20%)
        (feasibility, 0.6, None),  # mid
        (feasibility, 0.9, None),  # high
        (linear, 0.7, lambda k: 0.02 + 0.05 * k),  # a model drafter with real cost
    ],
    ids=["lin-low", "lin-mid", "lin-high", "cpu-low", "cpu-mid", "cpu-high", "lin-drafter"],
)
def test_long_run_goodput_vs_fixed_policies(curve, alpha: float, draft) -> None:
    best_fixed = max(fixed_goodput(alpha, curve, k, draft) for k in range(K_MAX + 1))
    for seed in range(3):  # cold start included: the cost model starts empty
        got, _, _ = simulate(alpha, curve, 3000, seed, draft=draft)
        assert got >= 0.95 * best_fixed, (seed, got, best_fixed)
        assert got >= 0.95 * fixed_goodput(alpha, curve, 0)  # never much slower than plain


# ------------------------------------------------------------------ pooled prior


def test_pool_alphas_follow_rounds_and_decay() -> None:
    pool = AcceptancePool(4, horizon=16)
    assert not pool.ready() and pool.alpha() == 0.5  # nothing pooled: the neutral prior
    for _ in range(200):
        pool.record(4, 4)
    assert pool.ready() and pool.alpha() > 0.85
    for _ in range(200):  # the traffic changes: old rounds decay away
        pool.record(4, 0)
    a = pool.alpha()
    assert a < 0.15 and pool.rounds < 17
    pool.record(0, 0)  # plain rounds carry no evidence
    assert pool.alpha() == a
    for bad in ((5, 0), (2, 3), (-1, 0)):
        with pytest.raises(ValueError):
            pool.record(*bad)
    with pytest.raises(ValueError):
        GoodputController(3, "sim", pool=pool)  # k_max mismatch


def _requests(alpha: float, n: int, pool: AcceptancePool | None, cost: CostModel, draft=None) -> tuple[float, list]:
    """n short requests (40 rounds each) one after another; goodput over all, and each one's Ks."""
    tokens, seconds, all_ks = 0, 0.0, []
    for i in range(n):
        ctl = GoodputController(K_MAX, "sim", pool=pool)
        g, ks, _ = simulate(alpha, linear, 40, seed=100 + i, ctl=ctl, cost=cost, draft=draft)
        t = sum(linear(k + 1) + (draft(k) if draft and k else 0.0) for k in ks)
        tokens, seconds = tokens + g * t, seconds + t
        all_ks.append(ks)
    return tokens / seconds, all_ks


def test_pool_spares_short_requests_the_relearning() -> None:
    """A drafter that never hits, an expensive draft: without a pool every short request pays to
    learn K = 0 and probes long; with one, later requests start at K = 0 and probe with K = 1."""
    draft = lambda k: 0.2 * k  # noqa: E731
    alone, _ = _requests(0.0, 12, None, measured(linear), draft)
    pooled, ks = _requests(0.0, 12, AcceptancePool(K_MAX), measured(linear), draft)
    plain = 1.0 / linear(1)
    assert pooled > alone  # what each request relearning costs
    assert pooled >= 0.97 * plain
    assert all(k == 0 for k in ks[-1][:8])  # starts at plain decoding
    assert set(ks[-1]) <= {0, 1}  # probes are one draft token


def test_pool_starts_good_drafters_at_their_k() -> None:
    pool = AcceptancePool(K_MAX)
    _, ks = _requests(0.9, 6, pool, measured(linear))
    assert ks[-1][0] >= 4  # the first round of a later request already drafts long
    assert pool.alpha() > 0.8


def test_surprise_drops_the_pooled_prior() -> None:
    """A request unlike the pool (it copies, the pool never hit) recovers after one surprising probe."""
    cost = measured(linear)
    pool = AcceptancePool(K_MAX)
    for _ in range(300):
        pool.record(2, 0)
    ctl = GoodputController(K_MAX, "sim", pool=pool, probe_interval=4)
    assert ctl.choose_k(cost) == 0
    while (k := ctl.choose_k(cost)) == 0:
        pass
    assert k >= 1
    ctl.record(k, k)  # full acceptance: P < 1% under the pooled prior
    assert ctl.tracker.prior_alpha == 0.5 and len(ctl.tracker) == 1  # the neutral prior again
    _, ks, _ = simulate(1.0, linear, 30, seed=7, ctl=ctl, cost=cost)
    assert all(k >= 3 for k in ks[-10:])


# ------------------------------------------------------------------ catch-up pricing


def _catching_up(
    alpha: float, draft_per_token: float, catch_per_token: float, timings: int = FEW_CATCH_UPS
) -> tuple[GoodputController, CostModel]:
    cost = measured(linear)
    for k in range(1, K_MAX + 1):
        cost.observe_draft("m", k, draft_per_token * k)
    for _ in range(timings):
        cost.observe_catch_up("m", 10, 10 * catch_per_token)
    ctl = GoodputController(K_MAX, "m")
    rng = random.Random(0)
    for _ in range(40):
        k = 4
        ctl.record(k, accepted_count(rng, k, alpha))
    return ctl, cost


def test_a_catch_up_that_speculation_cannot_repay_keeps_plain_decoding() -> None:
    """A model drafter at break-even (llama.cpp's Q4 draft against the native target): K > 0 only
    in steady state; after a pause (or before a request's first draft) its catch-up is not paid."""
    ctl, cost = _catching_up(alpha=0.9, draft_per_token=0.3, catch_per_token=0.5)
    assert ctl.choose_k(cost, catch_up=0, remaining=200) > 0  # steady state: still worth drafting
    assert ctl.choose_k(cost, catch_up=300, remaining=200) == 0  # a 300-token prompt to prefill first
    assert ctl.choose_k(cost, catch_up=300, remaining=None) > 0  # unbounded request: it pays back


def test_a_catch_up_that_speculation_repays_is_paid() -> None:
    ctl, cost = _catching_up(alpha=0.9, draft_per_token=0.01, catch_per_token=0.005)
    assert ctl.choose_k(cost, catch_up=300, remaining=200) > 0  # 1.5 s of catch-up, 200 tokens to gain on


def test_probes_are_skipped_when_their_catch_up_cannot_pay() -> None:
    ctl, cost = _catching_up(alpha=0.0, draft_per_token=0.3, catch_per_token=1.0)
    ks = [ctl.choose_k(cost, catch_up=20 + i, remaining=30) for i in range(300)]
    assert set(ks) == {0} and ctl.probes == 0  # a probe's catch-up comes out of its funds: never paid for here


def test_probes_go_ahead_while_the_catch_up_price_rests_on_few_timings() -> None:
    """One slow first timing must not price a drafter out for good: a skipped probe measures nothing."""
    ctl, cost = _catching_up(alpha=0.0, draft_per_token=0.3, catch_per_token=1.0, timings=1)
    ks = [ctl.choose_k(cost, catch_up=20, remaining=30) for _ in range(40)]
    assert ctl.probes > 0 and any(ks)  # the same price as the test above, from one timing


def test_a_catch_up_price_from_a_slow_minute_is_retried_not_kept_for_good() -> None:
    """A catch-up price taken while the machine stalled refused every probe, and a refused probe
    measures nothing: in a 5-arm bench, auto without a head drafted nothing in the 52 requests
    after one stalled request. Once the price is CATCH_UP_RETRY forwards old a probe goes ahead,
    and its timing, far off the stale price, starts the window again."""
    ctl, cost = _catching_up(alpha=0.9, draft_per_token=0.01, catch_per_token=1.0)  # the stalled price
    assert ctl.choose_k(cost, catch_up=0, remaining=200) > 0  # in steady state drafting pays ...
    ks = []
    for _ in range(2 * CATCH_UP_RETRY):
        k = ctl.choose_k(cost, catch_up=20, remaining=30)  # ... but not at that catch-up price
        cost.observe_forward(1 + k, linear(1 + k))
        if k:
            cost.observe_catch_up("m", 20, 20 * 0.001)  # what a catch-up costs now
            ctl.record(k, k)
        ks.append(k)
    assert not any(ks[: CATCH_UP_RETRY - 1])  # no retry before the price is CATCH_UP_RETRY forwards old
    assert sum(k > 0 for k in ks[-CATCH_UP_RETRY // 2 :]) >= 0.9 * CATCH_UP_RETRY // 2  # re-priced: drafting
    assert cost.catch_up_time("m", 20) == pytest.approx(20 * 0.001)


def test_a_retried_catch_up_that_agrees_with_its_price_keeps_it() -> None:
    """An expensive drafter priced out for good reason: a retry every CATCH_UP_RETRY forwards, its
    timing joins the window (no restart), and plain decoding goes on."""
    ctl, cost = _catching_up(alpha=0.9, draft_per_token=0.3, catch_per_token=0.5)
    ks = []
    for _ in range(3 * CATCH_UP_RETRY):
        k = ctl.choose_k(cost, catch_up=300, remaining=200)
        cost.observe_forward(1 + k, linear(1 + k))
        if k:
            cost.observe_catch_up("m", 300, 300 * 0.5)
        ks.append(k)
    assert 1 <= sum(k > 0 for k in ks) <= 3  # one retry per CATCH_UP_RETRY forwards at most
    assert cost.catch_up_timings("m") == FEW_CATCH_UPS + sum(k > 0 for k in ks)


# ------------------------------------------------------------------ re-measuring plain decoding


@pytest.mark.parametrize("alpha", [0.02, 0.05, 0.08])
def test_a_slow_first_plain_timing_does_not_lock_in_a_losing_speculation(alpha: float) -> None:
    """One inflated plain timing (1.5x: a GC pause) made speculation look better than plain, and
    plain was never timed again (0.79-0.84 of plain's goodput for 3000 rounds); down-probes
    re-measure it."""
    for seed in range(3):
        cost = CostModel()
        cost.observe_forward(1, 1.5 * linear(1))
        got, ks, ctl = simulate(alpha, linear, 3000, seed, cost=cost)
        assert got >= 0.99 * fixed_goodput(alpha, linear, 0), (seed, got)
        assert ctl.down_probes >= 1


def test_down_probes_cost_a_winning_speculation_almost_nothing() -> None:
    got, ks, ctl = simulate(0.9, linear, 3000, seed=3, cost=measured(linear))
    best = max(fixed_goodput(0.9, linear, k) for k in range(K_MAX + 1))
    assert got >= 0.97 * best and ctl.down_probes <= 3000 // DOWN_PROBE_EVERY + 1


def test_a_plain_price_from_a_slower_minute_is_replaced_once_stale() -> None:
    """The machine ran 1.6x slower while plain decoding was timed, then sped up: 2-row rounds timed
    since looked cheaper than a 1-row one, and a request whose drafts were never accepted drafted
    K = 1 in every round (engine, built-in code prompts). A size not timed for STALE_AFTER forwards
    starts its window again at its next timing (the down-probe), so K returns to 0."""
    cost = CostModel()
    for _ in range(15):
        cost.observe_forward(1, 1.6 * linear(1))  # the slow minute
    for _ in range(STALE_AFTER):
        cost.observe_forward(2, linear(2))  # the machine as it is now
    cost.observe_forward(1, linear(1))
    assert cost.forward_time(1) == linear(1) and cost.timings(1) == 1
    assert cost.forward_time(2) == linear(2) and cost.timings(2) == 15  # timed all along: kept
    for _ in range(STALE_AFTER):
        cost.observe_forward(2, linear(2))
    cost.observe_forward(1, 1.1 * linear(1))  # stale, but within STALE_SHIFT of its median: joins it
    assert cost.timings(1) == 2
    for seed in range(3):
        cost = CostModel()
        for _ in range(15):
            cost.observe_forward(1, 1.6 * linear(1))
        got, ks, ctl = simulate(0.0, linear, 2000, seed, cost=cost)
        assert sum(1 for k in ks[-1000:] if k) <= 40, (seed, sum(1 for k in ks[-1000:] if k))  # probes only
        assert got >= 0.95 * fixed_goodput(0.0, linear, 0), (seed, got)  # kept for good: 1 / 1.1 = 0.91
