"""Benchmark statistics on synthetic timings: exact percentiles, ratios, grouping, ITL, lossless."""

from __future__ import annotations

import math

import pytest

from draftgate.bench.lossless import lossless_check
from draftgate.bench.stats import (
    RequestRecord,
    WindowRecord,
    decode_speedups,
    distribution,
    group_by,
    itl_from_chunks,
    latency_ratios,
    percentile,
    ratio_summary,
    speedups,
    summarize_group,
)


def req(arm="a", cat="x", pid="1", turn=0, run=0, n=4, ttft=0.1, e2e=0.5, itl=(), ids=None, text="", **kw):
    return RequestRecord(arm, cat, pid, turn, "c=1", run, n, ttft, e2e, list(itl), ids, text, **kw)


def win(arm, run, wall, tokens, cat="x"):
    return WindowRecord(arm, cat, "c=1", run, wall, tokens)


def test_percentile_exact_on_known_arrays():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 100) == 5.0
    assert percentile(xs, 90) == pytest.approx(4.6)  # (n-1)*0.9 = 3.6 -> 4 + 0.6*(5-4)
    assert percentile(xs, 25) == 2.0
    assert percentile(list(range(101)), 99) == 99
    assert percentile([5.0, 1.0, 3.0], 50) == 3.0  # order does not matter
    assert percentile([7.0], 99) == 7.0
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    xs = rng.exponential(size=37).tolist()
    for q in (1, 10, 50, 90, 99):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_distribution_fields():
    d = distribution([1.0, 2.0, 3.0, 4.0])
    assert d == {"p50": 2.5, "p90": pytest.approx(3.7), "p99": pytest.approx(3.97), "mean": 2.5}
    assert all(math.isnan(v) for v in distribution([]).values())


def test_ratio_summary_min_median_max():
    assert ratio_summary([1.2, 0.9, 1.5]) == {"min": 0.9, "median": 1.2, "max": 1.5}
    assert ratio_summary([1.0, 2.0]) == {"min": 1.0, "median": 1.5, "max": 2.0}
    assert ratio_summary([1.0, math.nan, 3.0])["median"] == 2.0
    assert all(math.isnan(v) for v in ratio_summary([]).values())


def test_itl_splits_multi_token_chunks():
    # chunks at t=1.0 (1 tok: TTFT), 1.1 (1 tok), 1.4 (3 toks), an empty chunk, 1.6 (2 toks)
    times = [1.0, 1.1, 1.4, 1.5, 1.6]
    counts = [1, 1, 3, 0, 2]
    itl = itl_from_chunks(times, counts)
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert len(itl) == sum(counts) - 1
    assert itl_from_chunks([2.0], [5]) == []  # everything came with the first chunk


def test_group_by_keeps_first_seen_order():
    items = [("b", 1), ("a", 2), ("b", 3)]
    g = group_by(items, lambda t: t[0])
    assert list(g) == ["b", "a"]
    assert g["b"] == [("b", 1), ("b", 3)]


def test_speedups_are_per_run_total_throughput_ratios():
    base = [win("plain", 0, 2.0, 100), win("plain", 0, 2.0, 100), win("plain", 1, 1.0, 100)]  # 50, 100 tok/s
    arm = [win("spec", 0, 1.0, 100), win("spec", 0, 1.0, 100), win("spec", 1, 0.5, 100)]  # 100, 200 tok/s
    assert speedups(arm, base) == {"min": 2.0, "median": 2.0, "max": 2.0}
    arm2 = [win("spec", 0, 2.0, 100), win("spec", 1, 0.25, 100), win("spec", 2, 1.0, 100)]  # run 2: no baseline
    assert speedups(arm2, base) == {"min": 1.0, "median": 2.5, "max": 4.0}


def test_decode_speedups_leave_prefill_out():
    # Baseline decodes 3 tokens in 0.3 s after its first token in both runs (10 tok/s).
    base = [req(arm="p", n=4, ttft=0.2, e2e=0.5, run=0), req(arm="p", n=4, ttft=5.0, e2e=5.3, run=1)]
    # The arm: twice as fast in run 0 (prefill slower, which must not count), as fast in run 1.
    arm = [req(n=4, ttft=1.0, e2e=1.15, run=0), req(n=4, ttft=0.1, e2e=0.4, run=1), req(n=1, run=1, ttft=9, e2e=9)]
    assert decode_speedups(arm, base) == pytest.approx({"min": 1.0, "median": 1.5, "max": 2.0})


def test_latency_ratios_use_median_e2e_per_run():
    base = [req(arm="p", e2e=1.0, run=0), req(arm="p", e2e=3.0, run=0), req(arm="p", e2e=1.0, run=1)]
    arm = [req(e2e=0.5, run=0), req(e2e=1.5, run=0), req(e2e=0.25, run=1)]
    assert latency_ratios(arm, base) == {"min": 0.25, "median": 0.375, "max": 0.5}


def test_summarize_group_metrics():
    reqs = [
        req(n=10, ttft=0.1, e2e=1.0, itl=[0.1] * 9, rounds=4, draft_tokens=12, accepted_tokens=6, emitted_tokens=10),
        req(n=20, ttft=0.3, e2e=2.0, itl=[0.2] * 19, rounds=10, draft_tokens=8, accepted_tokens=2, emitted_tokens=12),
        req(n=0, error="boom"),
    ]
    wins = [win("a", 0, 3.0, 30), win("a", 1, 2.0, 30)]
    s = summarize_group(reqs, wins)
    assert (s["requests"], s["errors"], s["tokens"]) == (3, 1, 30)
    assert s["total_tps"] == 12.5  # median of 10 and 15
    assert s["total_tps_per_run"] == {"0": 10.0, "1": 15.0}
    assert s["stream_tps"] == 10.0
    assert s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["e2e_s"]["p50"] == pytest.approx(1.5)
    assert s["itl_s"]["p50"] == pytest.approx(0.2)  # 19 of 28 latencies are 0.2
    assert s["acceptance_rate"] == pytest.approx(8 / 20)
    assert s["mean_accepted_length"] == pytest.approx(22 / 14)
    plain = summarize_group([req(n=3)], [win("a", 0, 1.0, 3)])
    assert plain["acceptance_rate"] is None and plain["mean_accepted_length"] is None


def test_lossless_check_counts_and_locates_mismatches():
    reqs = [
        req(arm="plain", pid="1", ids=[5, 6, 7]),
        req(arm="plain", pid="2", ids=[1, 2]),
        req(arm="ngram", pid="1", ids=[5, 6, 7]),
        req(arm="ngram", pid="2", ids=[1, 3]),
        req(arm="remote", pid="1", text="hello", ids=None),
        req(arm="plain", pid="3", ids=[1]),
        req(arm="ngram", pid="3", error="failed"),  # errors are not compared
    ]
    reqs[0].text = "hello"
    out = lossless_check(reqs, "plain")
    assert out["ngram"]["compared"] == 2 and out["ngram"]["mismatches"] == 1
    ex = out["ngram"]["examples"][0]
    assert (ex["prompt_id"], ex["position"], ex["baseline"], ex["arm"]) == ("2", 1, 2, 3)
    assert out["remote"] == {"compared": 1, "mismatches": 0, "unit": "char", "examples": []}
    assert "plain" not in out
