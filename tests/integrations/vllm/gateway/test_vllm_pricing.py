"""RoundPricer: which drafts are worth a vLLM scoring round, from measured gaps, opens and rounds;
RouteGate: whether a greedy request runs rounds at all or passes through to vLLM's own decoding."""

from __future__ import annotations

import logging

import pytest

from draftgate.integrations.vllm.gateway.pricing import (
    MAX_BUCKET,
    MIN_ROUNDS,
    PROBE_EVERY,
    PROBE_REQUESTS,
    WINDOW,
    RoundPricer,
    RouteGate,
)

GAP = 0.01  # seconds per plain token: a plain rate of 100 tokens/s


def _pricer(gap: float = GAP) -> RoundPricer:
    p = RoundPricer()
    for _ in range(5):
        p.observe_gap(gap)
    return p


def _rounds(p: RoundPricer, context: int, n: int, tokens: int, seconds: float, reopened: bool = False) -> None:
    for _ in range(n):
        p.observe_round(context, tokens, seconds, reopened)


def test_unmeasured_bucket_is_always_worth_scoring() -> None:
    p = _pricer()
    _rounds(p, 3, MIN_ROUNDS - 1, tokens=1, seconds=1.0)  # 1 token/s, far below the plain rate
    assert p.round_rate(3) is None
    assert all(p.worth(3) for _ in range(2 * PROBE_EVERY))


def test_no_plain_rate_yet_scores_everything() -> None:
    p = RoundPricer()  # no gap measured: nothing to compare against
    _rounds(p, 2, MIN_ROUNDS, tokens=1, seconds=1.0)
    assert p.step() is None
    assert p.round_rate(2) == pytest.approx(1.0)
    assert all(p.worth(2) for _ in range(2 * PROBE_EVERY))


def test_slow_bucket_is_declined_except_one_probe_in_probe_every() -> None:
    p = _pricer()
    _rounds(p, 2, MIN_ROUNDS, tokens=1, seconds=0.05)  # 20 tokens/s < 100
    assert p.round_rate(2) == pytest.approx(20.0)
    answers = [p.worth(2) for _ in range(3 * PROBE_EVERY)]
    assert [i for i, a in enumerate(answers) if a] == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]


def test_round_no_better_than_plain_is_declined() -> None:
    p = _pricer(0.5)  # 2 tokens/s plain; rounds give exactly 2 tokens/s (exact in binary)
    _rounds(p, 1, MIN_ROUNDS, tokens=1, seconds=0.5)
    assert p.round_rate(1) * p.step() == 1.0
    assert not p.worth(1)


def test_fast_bucket_is_scored() -> None:
    p = _pricer()
    _rounds(p, 4, MIN_ROUNDS, tokens=3, seconds=0.02)  # 150 tokens/s > 100
    assert p.round_rate(4) == pytest.approx(150.0)
    assert all(p.worth(4) for _ in range(2 * PROBE_EVERY))


def test_buckets_are_priced_apart() -> None:
    p = _pricer()
    _rounds(p, 2, MIN_ROUNDS, tokens=1, seconds=0.05)  # slow
    _rounds(p, 5, MIN_ROUNDS, tokens=3, seconds=0.02)  # fast
    assert not p.worth(2)
    assert p.worth(5)
    assert p.worth(3)  # never tried
    assert p.round_rate(3) is None


def test_long_contexts_share_one_bucket() -> None:
    p = _pricer()
    assert {RoundPricer.bucket(c) for c in (MAX_BUCKET, MAX_BUCKET + 1, 100, 10**6)} == {MAX_BUCKET}
    assert RoundPricer.bucket(MAX_BUCKET - 1) == MAX_BUCKET - 1
    assert RoundPricer.bucket(-3) == 0
    # rounds observed at different long contexts pool into one bucket
    _rounds(p, MAX_BUCKET, MIN_ROUNDS // 2, tokens=1, seconds=0.05)
    _rounds(p, 1000, MIN_ROUNDS - MIN_ROUNDS // 2, tokens=1, seconds=0.05)
    assert p.round_rate(MAX_BUCKET) == pytest.approx(20.0)
    assert p.round_rate(50) == p.round_rate(MAX_BUCKET)
    assert p.round_rate(MAX_BUCKET - 1) is None
    # and so does the decline count: the probe comes on the PROBE_EVERY-th decline in the bucket
    answers = [p.worth(MAX_BUCKET + (i % 3) * 10) for i in range(PROBE_EVERY)]
    assert answers == [False] * (PROBE_EVERY - 1) + [True]


def test_bucket_recovers_once_good_rounds_fill_the_window() -> None:
    p = _pricer()
    _rounds(p, 3, WINDOW, tokens=1, seconds=0.05)
    assert not p.worth(3)
    _rounds(p, 3, WINDOW, tokens=3, seconds=0.02)
    assert p.round_rate(3) == pytest.approx(150.0)
    assert p.worth(3)


def test_reopen_cost_is_median_open_minus_median_gap() -> None:
    p = RoundPricer()
    assert p.reopen_cost() == 0.0  # nothing measured
    for s in (0.05, 0.07, 0.30):
        p.observe_open(s)
    assert p.reopen_cost() == 0.0  # opens but no gap yet
    for s in (0.01, 0.02, 0.90):
        p.observe_gap(s)
    assert p.reopen_cost() == pytest.approx(0.07 - 0.02)


def test_reopen_cost_is_never_negative() -> None:
    p = _pricer(0.02)
    p.observe_open(0.005)  # opening was faster than a plain token
    assert p.reopen_cost() == 0.0


def test_reopened_round_is_charged_the_reopen_cost() -> None:
    p = _pricer()
    p.observe_open(0.06)  # reopen cost 0.06 - 0.01 = 0.05 s
    assert p.reopen_cost() == pytest.approx(0.05)
    _rounds(p, 1, MIN_ROUNDS, tokens=4, seconds=0.03, reopened=False)
    _rounds(p, 2, MIN_ROUNDS, tokens=4, seconds=0.03, reopened=True)
    assert p.round_rate(1) == pytest.approx(4 / 0.03)
    assert p.round_rate(2) == pytest.approx(4 / (0.03 + 0.05))
    # 4 tokens in 0.03 s beat the plain rate (100/s); the same round plus a reopen does not
    assert p.worth(1)
    assert not p.worth(2)


def test_snapshot_reports_step_and_tokens_per_step() -> None:
    empty = RoundPricer().snapshot()
    assert empty == {"step_ms": None, "reopen_ms": 0.0, "round_tokens_per_step": {}}
    p = _pricer()
    p.observe_open(0.03)
    _rounds(p, 2, MIN_ROUNDS, tokens=3, seconds=0.02)  # 150 tokens/s: 1.5 per plain step
    _rounds(p, 20, MIN_ROUNDS, tokens=1, seconds=0.05)  # bucket MAX_BUCKET: 20 tokens/s: 0.2
    _rounds(p, 5, MIN_ROUNDS - 1, tokens=1, seconds=0.01)  # too few rounds: not reported
    snap = p.snapshot()
    assert snap["step_ms"] == 10.0
    assert snap["reopen_ms"] == 20.0
    assert snap["round_tokens_per_step"] == {2: 1.5, MAX_BUCKET: 0.2}


def test_a_draft_too_short_to_pay_is_never_scored() -> None:
    """A round taking 3.5 plain tokens' time cannot pay with a 1-token draft, even fully accepted."""
    p = RoundPricer()
    assert p.worth(5, 1)  # nothing measured yet: no break-even known
    for _ in range(8):
        p.observe_gap(0.02)
        p.observe_round(5, 8, 0.07, reopened=False)
    assert p.breakeven() == pytest.approx(3.5)
    assert not p.worth(5, 1) and not p.worth(5, 2)  # 2 or 3 tokens in the time of 3.5
    assert p.worth(5, 3) and p.worth(5, 16)  # the bucket pays (8 tokens a round): long drafts go


def test_verdict_needs_a_measured_bucket_and_a_plain_rate() -> None:
    p = RoundPricer()
    _rounds(p, 2, MIN_ROUNDS, tokens=1, seconds=1.0)
    assert p.verdict() is None  # no plain rate to compare with
    p = _pricer()
    _rounds(p, 2, MIN_ROUNDS - 1, tokens=1, seconds=1.0)
    assert p.verdict() is None  # too few rounds
    _rounds(p, 2, 1, tokens=1, seconds=1.0)
    assert p.verdict() is False


def test_one_paying_bucket_makes_rounds_pay() -> None:
    p = _pricer()
    _rounds(p, 1, MIN_ROUNDS, tokens=1, seconds=0.05)  # 20 tokens/s < 100
    assert p.verdict() is False
    _rounds(p, MAX_BUCKET, MIN_ROUNDS, tokens=6, seconds=0.04)  # 150 tokens/s > 100
    assert p.verdict() is True


def test_break_even_round_cost_is_the_tokens_a_round_emits() -> None:
    p = _pricer()
    assert p.average_round() is None
    _rounds(p, 1, MIN_ROUNDS, tokens=2, seconds=0.035)
    _rounds(p, 5, MIN_ROUNDS, tokens=4, seconds=0.035)
    made, cost = p.average_round()
    assert made == pytest.approx(3.0)  # rounds pay while they cost less than 3 plain tokens
    assert p.breakeven() == pytest.approx(3.5) and cost == pytest.approx(3.5)  # on average they do not...
    assert p.verdict() is True  # ...but the longer matches' do: the route keeps rounds, the pricer declines short ones
    assert not p.worth(1) and p.worth(5)


def test_gate_runs_rounds_until_they_are_known_not_to_pay(caplog: pytest.LogCaptureFixture) -> None:
    p = _pricer()
    gate = RouteGate(p)
    assert all(gate.rounds() for _ in range(3)) and gate.passed == 0
    _rounds(p, 3, MIN_ROUNDS, tokens=2, seconds=0.05)  # 40 tokens/s < 100
    with caplog.at_level(logging.INFO, "draftgate.vllm_rounds"):
        answers = [gate.rounds() for _ in range(2 * PROBE_REQUESTS)]
    assert [i for i, a in enumerate(answers) if a] == [PROBE_REQUESTS - 1, 2 * PROBE_REQUESTS - 1]  # probes
    assert gate.passed == 2 * PROBE_REQUESTS - 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "do not pay" in said[0] and "cost 5.00 plain tokens and emitted 2.00" in said[0]


def test_gate_returns_to_rounds_when_a_probe_finds_they_pay(caplog: pytest.LogCaptureFixture) -> None:
    p = _pricer()
    gate = RouteGate(p)
    _rounds(p, 3, MIN_ROUNDS, tokens=2, seconds=0.05)
    assert not gate.rounds()
    _rounds(p, MAX_BUCKET, MIN_ROUNDS, tokens=8, seconds=0.04)  # a probe's long matches: 200 tokens/s
    with caplog.at_level(logging.INFO, "draftgate.vllm_rounds"):
        assert all(gate.rounds() for _ in range(2 * PROBE_REQUESTS))
    assert gate.passed == 1
    assert any("pay again" in r.getMessage() for r in caplog.records)
