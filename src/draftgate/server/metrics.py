"""Prometheus sink: vLLM-compatible names under ``draftgate:``, labelled by route (``model_name``).

Speculation counts come from the request's ``SpecStats`` (collected once, by the
engine) when the request ends; latencies are measured here, at the edge; gauges
(KV blocks, queue, the speculation switch) and a vLLM round route's verification counts (near
ties, contradicted and unconfirmed tokens) are read from the back ends on scrape.
Each app has its own ``CollectorRegistry``: no module-level state.

``spec_decode_num_drafts`` counts verification rounds (``SpecStats.rounds``), so
vLLM's "mean acceptance length = 1 + accepted / drafts" equals our
``mean_accepted_length`` (which counts the bonus/recovered token).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from draftgate.server.routes import Route, RouteTable
from draftgate.types import SpecStats

__all__ = ["ServerMetrics", "RequestTrace"]

P = "draftgate:"
ROUTE = ["model_name"]
# What a route verifying on a vLLM server could not settle in its rounds (Backend.verification_counts).
VERIFICATION_COUNTS = (
    ("near_ties", "near_ties", "Draft positions whose scored argmax led by less than the margin: vLLM's token taken."),
    ("contradicted", "contradicted_tokens", "Emitted tokens vLLM's own decoding later chose otherwise (logged)."),
    ("unconfirmed", "unconfirmed_tokens", "Tokens emitted on a scoring pass's evidence that no stream reached."),
    ("passed_through", "passed_through_requests", "Greedy requests relayed to vLLM's decoding: rounds did not pay."),
)
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)
_E2E_BUCKETS = (
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
)
_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _RouteGauges(Collector):
    """Gauges read from the back ends at scrape time."""

    def __init__(self, routes: RouteTable) -> None:
        self._routes = routes

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        used = GaugeMetricFamily(P + "kv_blocks_used", "KV cache blocks in use (incl. cached prefixes).", labels=ROUTE)
        free = GaugeMetricFamily(P + "kv_blocks_free", "KV cache blocks on the free list.", labels=ROUTE)
        spec = GaugeMetricFamily(P + "speculation_enabled", "1 if the route decodes speculatively.", labels=ROUTE)
        running = GaugeMetricFamily(P + "num_requests_running", "Requests in the running batch.", labels=ROUTE)
        waiting = GaugeMetricFamily(P + "num_requests_waiting", "Requests queued for admission.", labels=ROUTE)
        checks = {
            name: CounterMetricFamily(P + "vllm_rounds_" + metric, text, labels=ROUTE)
            for name, metric, text in VERIFICATION_COUNTS
        }
        for r in self._routes:
            for name, n in r.engine.verification_counts().items():
                checks[name].add_metric([r.name], n)
            kv = r.engine.kv_stats()
            used.add_metric([r.name], kv.get("used_blocks", 0))
            free.add_metric([r.name], kv.get("free_blocks", 0))
            spec.add_metric([r.name], 1.0 if r.speculative else 0.0)
            running.add_metric([r.name], r.engine.num_running)
            waiting.add_metric([r.name], r.engine.num_waiting)
        yield from (used, free, spec, running, waiting, *checks.values())


class ServerMetrics:
    def __init__(self, routes: RouteTable) -> None:
        self.registry = reg = CollectorRegistry()
        self.num_drafts = Counter(P + "spec_decode_num_drafts", "Verification rounds.", ROUTE, registry=reg)
        self.num_draft_tokens = Counter(
            P + "spec_decode_num_draft_tokens", "Draft tokens proposed.", ROUTE, registry=reg
        )
        self.num_accepted_tokens = Counter(
            P + "spec_decode_num_accepted_tokens", "Draft tokens accepted.", ROUTE, registry=reg
        )
        self.accepted_per_pos = Counter(
            P + "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each position (0 = first draft token).",
            [*ROUTE, "position"],
            registry=reg,
        )
        self.request_success = Counter(
            P + "request_success", "Requests finished (stop or length).", [*ROUTE, "finished_reason"], registry=reg
        )
        self.request_failure = Counter(
            P + "request_failure",
            "Requests that did not finish: abort (client gone), error, capacity (429), bad_request (400).",
            [*ROUTE, "reason"],
            registry=reg,
        )
        self.approximate_requests = Counter(
            P + "spec_decode_approximate_requests",
            "Requests verified by an approximation the route allows (sampling on an openai+http target).",
            ROUTE,
            registry=reg,
        )
        self.fallback_rounds = Counter(
            P + "spec_decode_fallback_rounds",
            "Rounds whose drafts the target could not score (an error, a garbage row, a timeout): decoded plainly.",
            ROUTE,
            registry=reg,
        )
        self.target_decoded_requests = Counter(
            P + "spec_decode_target_decoded_requests",
            "Sampled requests that ran entirely on the target server's own decoding (vllm+http rounds).",
            ROUTE,
            registry=reg,
        )
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prefilled prompt tokens.", ROUTE, registry=reg)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens.", ROUTE, registry=reg)
        self.ttft = Histogram(
            P + "time_to_first_token_seconds", "Time to first token.", ROUTE, buckets=_TTFT_BUCKETS, registry=reg
        )
        self.itl = Histogram(
            P + "inter_token_latency_seconds",
            "Time between successive token deliveries of a request.",
            ROUTE,
            buckets=_ITL_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            P + "e2e_request_latency_seconds", "End-to-end request latency.", ROUTE, buckets=_E2E_BUCKETS, registry=reg
        )
        self.draft_time = Histogram(
            P + "spec_decode_draft_time_seconds",
            "Drafting time per request.",
            ROUTE,
            buckets=_STEP_BUCKETS,
            registry=reg,
        )
        self.verify_time = Histogram(
            P + "spec_decode_verify_time_seconds",
            "Target verification time per request.",
            ROUTE,
            buckets=_STEP_BUCKETS,
            registry=reg,
        )
        reg.register(_RouteGauges(routes))
        for r in routes:  # every route's series exist (at 0) from the start
            for c in (
                self.num_drafts,
                self.num_draft_tokens,
                self.num_accepted_tokens,
                self.prompt_tokens,
                self.approximate_requests,
                self.fallback_rounds,
                self.target_decoded_requests,
            ):
                c.labels(r.name)
            self.generation_tokens.labels(r.name)

    def trace(self, route: Route) -> RequestTrace:
        return RequestTrace(self, route.name)

    def failure(self, route: Route, reason: str) -> None:
        self.request_failure.labels(route.name, reason).inc()


class RequestTrace:
    """Latencies of one request, measured from its arrival; ``finish`` reports it once."""

    def __init__(self, metrics: ServerMetrics, route: str) -> None:
        self._m = metrics
        self._route = route
        self._t0 = self._last = time.perf_counter()
        self._first = True
        self._done = False
        self.first_tokens = 0  # tokens in the first delivery
        self._t_first = self._t0

    def tokens(self, n: int) -> None:
        if n <= 0:
            return
        now = time.perf_counter()
        if self._first:
            self._m.ttft.labels(self._route).observe(now - self._t0)
            self._first = False
            self.first_tokens, self._t_first = n, now
        else:
            self._m.itl.labels(self._route).observe(now - self._last)
        self._last = now

    def timings(self) -> tuple[float, float]:
        """(seconds since arrival, seconds from the first delivery to the last)."""
        return time.perf_counter() - self._t0, self._last - self._t_first

    def finish(self, reason: str, prompt_tokens: int, completion_tokens: int, stats: SpecStats | None) -> None:
        if self._done:
            return
        self._done = True
        m, r = self._m, self._route
        m.prompt_tokens.labels(r).inc(prompt_tokens)
        m.generation_tokens.labels(r).inc(completion_tokens)
        if reason in ("stop", "length"):
            m.request_success.labels(r, reason).inc()
            m.e2e.labels(r).observe(time.perf_counter() - self._t0)
        else:
            m.request_failure.labels(r, reason).inc()
        if stats is None:
            return
        if stats.approximate:
            m.approximate_requests.labels(r).inc()
        if stats.target_decoded:
            m.target_decoded_requests.labels(r).inc()
        m.fallback_rounds.labels(r).inc(stats.fallback_rounds)
        m.num_drafts.labels(r).inc(stats.rounds)
        m.num_draft_tokens.labels(r).inc(stats.draft_tokens)
        m.num_accepted_tokens.labels(r).inc(stats.accepted_tokens)
        for pos, n in enumerate(stats.accepted_per_pos):
            m.accepted_per_pos.labels(r, str(pos)).inc(n)
        if stats.draft_time_s > 0:
            m.draft_time.labels(r).observe(stats.draft_time_s)
        if stats.verify_time_s > 0:
            m.verify_time.labels(r).observe(stats.verify_time_s)
