"""CanaryMonitor: pure verdicts on synthetic samples (no clocks)."""

from __future__ import annotations

import pytest

from draftgate.server.ops import Arm, CanaryConfig, CanaryMonitor, Sample


def feed(m: CanaryMonitor, arm: Arm, n: int, tps: float, itl: float) -> str | None:
    out = None
    for _ in range(n):
        out = m.record(arm, Sample(tps, itl)) or out
    return out


def test_no_verdict_before_enough_samples_per_arm() -> None:
    m = CanaryMonitor(CanaryConfig(min_samples=20))
    assert feed(m, Arm.PLAIN, 100, 100.0, 0.01) is None
    assert feed(m, Arm.SPECULATIVE, 19, 10.0, 0.1) is None  # far worse, but 19 < 20
    assert m.record(Arm.SPECULATIVE, Sample(10.0, 0.1)) is not None


def test_slower_speculative_arm_rolls_back_with_a_reason() -> None:
    m = CanaryMonitor()
    feed(m, Arm.PLAIN, 20, 100.0, 0.010)
    reason = feed(m, Arm.SPECULATIVE, 20, 90.0, 0.010)  # 10% fewer tokens/s > 5% margin
    assert reason is not None and "tokens/s" in reason and "10%" in reason


def test_within_margin_or_faster_is_kept() -> None:
    m = CanaryMonitor()
    feed(m, Arm.PLAIN, 30, 100.0, 0.010)
    assert feed(m, Arm.SPECULATIVE, 30, 96.0, 0.0104) is None  # 4% worse: noise
    m.reset()
    feed(m, Arm.PLAIN, 30, 100.0, 0.010)
    assert feed(m, Arm.SPECULATIVE, 30, 180.0, 0.006) is None


def test_worse_itl_alone_rolls_back() -> None:
    m = CanaryMonitor(CanaryConfig(margin=0.05, min_samples=5, window=10))
    feed(m, Arm.PLAIN, 5, 100.0, 0.010)
    reason = feed(m, Arm.SPECULATIVE, 5, 100.0, 0.020)
    assert reason is not None and "ITL" in reason


def test_sliding_window_forgets_old_samples() -> None:
    m = CanaryMonitor(CanaryConfig(min_samples=5, window=10))
    feed(m, Arm.PLAIN, 10, 100.0, 0.01)
    feed(m, Arm.SPECULATIVE, 10, 200.0, 0.005)  # good at first
    # the route got worse: 10 new slow samples push the fast ones out of the window
    assert feed(m, Arm.SPECULATIVE, 10, 50.0, 0.02) is not None
    assert m.count(Arm.SPECULATIVE) == 10


def test_medians_resist_one_outlier() -> None:
    m = CanaryMonitor(CanaryConfig(min_samples=5, window=20))
    feed(m, Arm.PLAIN, 9, 100.0, 0.01)
    feed(m, Arm.SPECULATIVE, 9, 120.0, 0.008)
    assert m.record(Arm.SPECULATIVE, Sample(1.0, 1.0)) is None  # one stalled request


@pytest.mark.parametrize("kw", [{"margin": -0.1}, {"margin": 1.0}, {"min_samples": 0}, {"min_samples": 200}])
def test_config_is_validated(kw: dict) -> None:
    with pytest.raises(ValueError):
        CanaryMonitor(CanaryConfig(**kw))
