"""Prometheus sink for the operating state: per-route gauges read on scrape, counters on events."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from draftgate.server.ops.shadow import predicted_speedup
from draftgate.server.ops.state import Ops

__all__ = ["install_ops_metrics"]

P = "draftgate:"
ROUTE = ["model_name"]


class _OpsGauges(Collector):
    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        def g(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(P + name, doc, labels=ROUTE)

        enabled = g("route_speculation_switch", "1 if speculation is switched on for the route (admin/canary).")
        canary = g("route_canary_fraction", "Fraction of the route's requests that speculate.")
        shadow = g("route_shadow_fraction", "Fraction of the route's requests replayed in shadow mode.")
        lossless = g("route_lossless_fraction", "Fraction of greedy speculative requests re-run plainly.")
        acc = g("shadow_predicted_acceptance_rate", "Shadow mode: predicted draft acceptance rate.")
        mal = g("shadow_predicted_mean_accepted_length", "Shadow mode: predicted tokens per round.")
        speed = g("shadow_predicted_speedup", "Shadow mode: predicted speedup over plain decoding.")
        for name, ro in self._ops.routes.items():
            enabled.add_metric([name], 1.0 if ro.route.enabled else 0.0)
            canary.add_metric([name], ro.canary_fraction)
            shadow.add_metric([name], ro.shadow_fraction)
            lossless.add_metric([name], ro.lossless_fraction)
            acc.add_metric([name], ro.shadow.acceptance_rate)
            mal.add_metric([name], ro.shadow.mean_accepted_length)
            speed.add_metric([name], predicted_speedup(ro.shadow, ro.cost_model()))
        yield from (enabled, canary, shadow, lossless, acc, mal, speed)


def install_ops_metrics(registry: CollectorRegistry, ops: Ops) -> None:
    changes = Counter(
        P + "admin_changes", "Admin (or canary) changes to a route's settings.", [*ROUTE, "field"], registry=registry
    )
    rollbacks = Counter(
        P + "canary_rollbacks", "Speculation switched off by the canary monitor.", ROUTE, registry=registry
    )
    checks = Counter(
        P + "lossless_canary_checks",
        "Greedy speculative outputs re-run plainly and compared.",
        ROUTE,
        registry=registry,
    )
    mismatches = Counter(
        P + "lossless_canary_mismatches", "Lossless canary checks whose outputs differed.", ROUTE, registry=registry
    )
    for name in ops.routes:
        rollbacks.labels(name)
        checks.labels(name)
        mismatches.labels(name)
    registry.register(_OpsGauges(ops))
    ops.on_change.append(lambda route, field: changes.labels(route, field).inc())
    ops.on_rollback.append(lambda route: rollbacks.labels(route).inc())

    def lossless(route: str, mismatch: bool) -> None:
        checks.labels(route).inc()
        if mismatch:
            mismatches.labels(route).inc()

    ops.on_lossless.append(lossless)
