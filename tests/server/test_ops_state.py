"""Ops without a server: per-request arm choice, admin updates, rollback from synthetic requests."""

from __future__ import annotations

import pytest

from draftgate.drafters import NgramDrafter
from draftgate.engine import CostModel
from draftgate.server import Route, RouteTable
from draftgate.server.ops import CanaryConfig, Finished, Ops, OpsConfig
from draftgate.types import SamplingParams, SpecStats


class FakeBackend:
    """Just enough of the Backend shape for Ops (no engine, no target model)."""

    def __init__(self) -> None:
        self.drafter = NgramDrafter()
        self.speculation_enabled = True
        self.k, self.k_max = None, 8
        self.cost = CostModel()
        self.max_context = 96

    def submit(self, ids, params, sink, speculate: bool = True):  # type: ignore[no-untyped-def]
        return lambda: None


def make(**cfg: object) -> tuple[Ops, Route]:
    route = Route("r", FakeBackend())  # type: ignore[arg-type]
    return Ops(RouteTable.of([route]), OpsConfig(seed=0, **cfg)), route  # type: ignore[arg-type]


def finished(speculate: bool, tps: float) -> Finished:
    n = 10
    return Finished("id", [1, 2], list(range(n)), SamplingParams(), SpecStats(), speculate, n / tps, (n - 1) / tps, 1)


def test_arm_choice_follows_the_canary_fraction() -> None:
    ops, route = make()
    assert all(ops.choose(route) for _ in range(50))  # fraction 1: all speculate
    ops.update("r", {"canary_fraction": 0.0})
    assert not any(ops.choose(route) for _ in range(50))
    ops.update("r", {"canary_fraction": 0.3})
    n = sum(ops.choose(route) for _ in range(2000))
    assert 450 < n < 750
    ops.update("r", {"enabled": False})
    assert all(ops.choose(route) for _ in range(50))  # off: the engine's switch decides (plain)
    assert not route.speculative


def test_update_is_all_or_nothing_and_notifies() -> None:
    ops, route = make()
    seen: list[tuple[str, str]] = []
    ops.on_change.append(lambda r, f: seen.append((r, f)))
    with pytest.raises(ValueError):
        ops.update("r", {"canary_fraction": 0.5, "shadow_fraction": 2.0})
    assert ops["r"].canary_fraction == 1.0 and not seen
    ops.update("r", {"canary_fraction": 0.5, "shadow_fraction": 0.2, "enabled": False})
    assert sorted(seen) == [("r", "canary_fraction"), ("r", "enabled"), ("r", "shadow_fraction")]


def test_rollback_after_enough_losing_samples() -> None:
    ops, route = make(canary=CanaryConfig(min_samples=5, window=10))
    rolled: list[str] = []
    ops.on_rollback.append(rolled.append)
    ops.update("r", {"canary_fraction": 0.5})
    for _ in range(5):
        ops.finished(route, finished(False, 100.0))
        ops.finished(route, finished(True, 80.0))
    assert rolled == ["r"] and not route.enabled and not route.speculative
    snap = ops["r"].snapshot()
    assert snap["canary"]["rollbacks"] == 1 and "tokens/s" in snap["last_rollback_reason"]
    assert snap["stats"]["requests"] == 10


def test_fractions_come_from_the_route_and_are_validated() -> None:
    route = Route("r", FakeBackend(), canary_fraction=0.0, shadow_fraction=0.5)  # type: ignore[arg-type]
    ops = Ops(RouteTable.of([route]))
    assert ops["r"].snapshot()["canary_fraction"] == 0.0 and ops["r"].shadow_fraction == 0.5
    assert not ops.choose(route)
    ops.update("r", {"canary_fraction": 1.0})
    assert route.canary_fraction == 1.0
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match="canary_fraction"):
            Route("r", FakeBackend(), canary_fraction=bad)  # type: ignore[arg-type]
