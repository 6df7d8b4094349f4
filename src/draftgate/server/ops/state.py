"""Per-route operating state: canary and shadow fractions, live stats, rollbacks, shadow and lossless results.

``Ops`` is the gateway's one handle on it (hung off ``app.state.ops``):

1. ``choose(route)``: per request, before submit: may it speculate. A route that
   is off decodes plainly; a route that is on with ``canary_fraction`` x in (0, 1)
   speculates on x of its requests (a seeded ``random.Random``), the rest are the
   plain control arm (``submit(..., speculate=False)``); x = 1 speculates on all
   (no canary), x = 0 on none. Back ends whose ``submit`` takes no ``speculate=``
   (remote ones) get no canary: the route's switch alone decides.
2. ``finished(...)``: after a request ends well: live stats, a canary sample (and
   maybe the auto-rollback), a shadow replay and a lossless re-run, both queued
   on bounded background workers (dropped when full).

The kill switch (``update``) flips the engine's speculation switch: requests in
flight finish plainly from their next round on (the engine reads the switch each
round); requests admitted later follow the new setting.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from draftgate.engine import CostModel
from draftgate.server.ops.canary import Arm, CanaryConfig, CanaryMonitor, Sample
from draftgate.server.ops.lossless import LosslessResult, rerun_plain
from draftgate.server.ops.shadow import ShadowTotals, predicted_speedup, score_sequence
from draftgate.server.ops.worker import BackgroundWorker
from draftgate.server.routes import Backend, Route, RouteTable
from draftgate.types import SamplingParams, SpecStats

__all__ = ["Ops", "OpsConfig", "RouteOps", "Finished"]

log = logging.getLogger("draftgate.server.ops")


_PRIOR = CostModel()  # never observed: forward and draft prices in prior units


@dataclass(frozen=True)
class OpsConfig:
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    shadow_k: int = 4  # draft tokens per replayed round
    shadow_queue: int = 64  # finished requests waiting for a shadow replay; more are dropped
    lossless_fraction: float = 0.0  # of greedy speculative requests re-run plainly and compared
    lossless_queue: int = 8
    lossless_keep: int = 10  # the last mismatches shown by GET /admin/routes
    background_cpu_share: float = 0.25  # of one core, per background worker
    seed: int | None = None  # of the canary/shadow/lossless draws (None: from the OS)

    def validate(self) -> OpsConfig:
        self.canary.validate()
        _fraction("lossless_fraction", self.lossless_fraction)
        if self.shadow_k < 1 or self.shadow_queue < 1 or self.lossless_queue < 1 or self.lossless_keep < 1:
            raise ValueError("shadow_k, shadow_queue, lossless_queue and lossless_keep must be positive")
        return self


def _fraction(name: str, x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= float(x) <= 1.0:
        raise ValueError(f"{name} must be a number in [0, 1], got {x!r}")
    return float(x)


@dataclass(frozen=True)
class Finished:
    """One request that ended with stop or length, as the edge measured it."""

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    params: SamplingParams
    stats: SpecStats | None
    speculate: bool  # False: it was forced plain (the canary's control arm)
    e2e_s: float
    decode_s: float  # first delivery to last
    first_tokens: int  # tokens in the first delivery


@dataclass
class RouteOps:
    route: Route
    lossless_fraction: float = 0.0
    monitor: CanaryMonitor = field(default_factory=CanaryMonitor)
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0
    spec: SpecStats = field(default_factory=SpecStats)
    last_rollback: str | None = None
    rollbacks: int = 0
    shadow: ShadowTotals = field(default_factory=ShadowTotals)
    lossless_checks: int = 0
    lossless_mismatches: int = 0
    recent_mismatches: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=10))
    lossless_reference: Backend | None = None  # None: the route's own engine (tests inject another)
    shadow_cost: CostModel | None = None

    # The fractions live on the Route (set by the routes file, changed by the admin API).
    @property
    def canary_fraction(self) -> float:
        return self.route.canary_fraction

    @canary_fraction.setter
    def canary_fraction(self, x: float) -> None:
        self.route.canary_fraction = x

    @property
    def shadow_fraction(self) -> float:
        return self.route.shadow_fraction

    @shadow_fraction.setter
    def shadow_fraction(self, x: float) -> None:
        self.route.shadow_fraction = x

    @property
    def canarying(self) -> bool:
        return self.route.enabled and 0.0 < self.canary_fraction < 1.0

    def cost_model(self) -> CostModel:
        """The back end's measured costs (prior units when it has none) for predicted speedups."""
        return self.shadow_cost or self.route.engine.cost or _PRIOR

    def snapshot(self) -> dict[str, Any]:
        engine = self.route.engine
        k = engine.k
        return {
            "name": self.route.name,
            "enabled": self.route.enabled,
            "speculating": self.route.speculative,
            "drafter": self.route.drafter_name,
            "k_policy": "none" if engine.drafter is None else ("adaptive" if k is None else f"fixed:{k}"),
            "k_max": engine.k_max,
            "canary_fraction": self.canary_fraction,
            "shadow_fraction": self.shadow_fraction,
            "lossless_fraction": self.lossless_fraction,
            "stats": {
                "requests": self.requests,
                "acceptance_rate": self.spec.acceptance_rate,
                "mean_accepted_length": self.spec.mean_accepted_length,
                "tokens_per_s": self.tokens / self.seconds if self.seconds > 0 else 0.0,
            },
            "canary": {"arms": self.monitor.summary(), "rollbacks": self.rollbacks},
            "last_rollback_reason": self.last_rollback,
            "shadow": {
                "requests": self.shadow.requests,
                "predicted_acceptance_rate": self.shadow.acceptance_rate,
                "predicted_mean_accepted_length": self.shadow.mean_accepted_length,
                "predicted_speedup": predicted_speedup(self.shadow, self.cost_model()),
            },
            "lossless": {
                "checks": self.lossless_checks,
                "mismatches": self.lossless_mismatches,
                "recent_mismatches": list(self.recent_mismatches),
            },
        }


class Ops:
    def __init__(self, routes: RouteTable, config: OpsConfig | None = None) -> None:
        self.config = (config or OpsConfig()).validate()
        self.routes: dict[str, RouteOps] = {
            r.name: RouteOps(
                r,
                lossless_fraction=self.config.lossless_fraction,
                monitor=CanaryMonitor(self.config.canary),
                recent_mismatches=deque(maxlen=self.config.lossless_keep),
            )
            for r in routes
        }
        self._rng = random.Random(self.config.seed)
        self._lock = threading.Lock()  # shadow/lossless results land from worker threads
        c = self.config
        self.shadow_worker = BackgroundWorker("shadow", c.shadow_queue, c.background_cpu_share)
        self.lossless_worker = BackgroundWorker("lossless", c.lossless_queue, c.background_cpu_share)
        self.on_change: list[Any] = []  # callbacks(route, field) (the metrics sink registers one)
        self.on_rollback: list[Any] = []
        self.on_lossless: list[Any] = []  # callbacks(route, mismatch: bool)

    def __getitem__(self, name: str) -> RouteOps:
        return self.routes[name]

    def close(self) -> None:
        self.shadow_worker.stop()
        self.lossless_worker.stop()

    # ---------------------------------------------------------------- admin

    def update(self, name: str, changes: dict[str, Any], who: str = "admin") -> RouteOps:
        """Apply an admin change (validated first, all or nothing); logged and counted."""
        ro = self.routes[name]
        enabled = changes.get("enabled")
        if "enabled" in changes and not isinstance(enabled, bool):
            raise ValueError(f"enabled must be true or false, got {enabled!r}")
        fractions = {f: _fraction(f, changes[f]) for f in _FRACTIONS if f in changes}
        for f, v in fractions.items():
            if getattr(ro, f) != v:
                log.info("%s: route %s %s %s -> %s", who, name, f, getattr(ro, f), v)
                setattr(ro, f, v)
                self._changed(name, f)
        if "canary_fraction" in fractions:
            ro.monitor.reset()
        if enabled is not None and enabled != ro.route.enabled:
            log.info("%s: route %s speculation %s", who, name, "enabled" if enabled else "disabled")
            ro.route.set_enabled(enabled)
            ro.monitor.reset()
            self._changed(name, "enabled")
        return ro

    def _changed(self, name: str, what: str) -> None:
        for cb in self.on_change:
            cb(name, what)

    # ------------------------------------------------------------- requests

    def choose(self, route: Route) -> bool:
        """False: this request is forced plain (the canary's control arm, submitted with
        ``speculate=False``); True: the engine's switch decides (off routes decode plainly anyway)."""
        ro = self.routes[route.name]
        if not route.speculative:
            return True
        if ro.canary_fraction >= 1.0:
            return True
        if ro.canary_fraction <= 0.0:
            return False
        return self._rng.random() < ro.canary_fraction

    def finished(self, route: Route, f: Finished) -> None:
        ro = self.routes[route.name]
        n = len(f.output_ids)
        ro.requests += 1
        ro.tokens += n
        ro.seconds += f.e2e_s
        if f.stats is not None:
            ro.spec.merge(f.stats)
        if ro.canarying and n > 0 and f.e2e_s > 0:
            itl = f.decode_s / (n - f.first_tokens) if n > f.first_tokens else 0.0
            arm = Arm.SPECULATIVE if f.speculate else Arm.PLAIN
            reason = ro.monitor.record(arm, Sample(n / f.e2e_s, itl))
            if reason is not None:
                self._rollback(ro, reason)
        self._maybe_shadow(ro, f)
        self._maybe_lossless(ro, f)

    def _rollback(self, ro: RouteOps, reason: str) -> None:
        ro.route.set_enabled(False)
        ro.last_rollback = reason
        ro.rollbacks += 1
        ro.monitor.reset()
        log.warning("canary: speculation on route %s rolled back: %s", ro.route.name, reason)
        for cb in self.on_rollback:
            cb(ro.route.name)
        self._changed(ro.route.name, "enabled")

    # --------------------------------------------------------------- shadow

    def _maybe_shadow(self, ro: RouteOps, f: Finished) -> None:
        drafter = ro.route.engine.drafter
        if drafter is None or ro.route.speculative or ro.shadow_fraction <= 0.0 or not f.output_ids:
            return
        if self._rng.random() >= ro.shadow_fraction:
            return
        tokens = [*f.prompt_ids, *f.output_ids]

        def job() -> None:
            if ro.route.speculative:  # the route speculates now: its drafter is the engine's again
                return
            score = score_sequence(drafter, tokens, len(f.prompt_ids), self.config.shadow_k, f.params)
            with self._lock:
                ro.shadow.add(score)

        self.shadow_worker.submit(job)

    # ------------------------------------------------------------- lossless

    def _maybe_lossless(self, ro: RouteOps, f: Finished) -> None:
        greedy = f.params.temperature == 0.0
        drafted = f.stats is not None and f.stats.draft_tokens > 0
        if not (greedy and f.speculate and drafted) or ro.lossless_fraction <= 0.0:
            return
        if self._rng.random() >= ro.lossless_fraction:
            return
        ref = ro.lossless_reference or ro.route.engine

        def job() -> None:
            res = rerun_plain(ref, f.prompt_ids, f.params, f.output_ids, f.request_id)
            if res is None:  # the reference could not run it (busy, failed): not a check
                return
            self._record_lossless(ro, res)

        self.lossless_worker.submit(job)

    def _record_lossless(self, ro: RouteOps, res: LosslessResult) -> None:
        with self._lock:
            ro.lossless_checks += 1
            if res.first_diff is not None:
                ro.lossless_mismatches += 1
                ro.recent_mismatches.append(
                    {"request_id": res.request_id, "first_differing_position": res.first_diff, "at": time.time()}
                )
                log.error(
                    "lossless canary: route %s request %s differs from plain decoding at output position %d",
                    ro.route.name,
                    res.request_id,
                    res.first_diff,
                )
        for cb in self.on_lossless:
            cb(ro.route.name, res.first_diff is not None)


_FRACTIONS = ("canary_fraction", "shadow_fraction", "lossless_fraction")
