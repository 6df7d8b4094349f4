"""/metrics: vLLM-style names under draftgate:, labelled by route, fed by each request's SpecStats."""

from __future__ import annotations

import httpx
from gateway_support import Gateway, metric
from prometheus_client.parser import text_string_to_metric_families

MSG = [{"role": "user", "content": "hello world the an is of and hello world"}]

COUNTERS = [
    "draftgate:spec_decode_num_drafts",
    "draftgate:spec_decode_num_draft_tokens",
    "draftgate:spec_decode_num_accepted_tokens",
    "draftgate:spec_decode_num_accepted_tokens_per_pos",
    "draftgate:request_success",
    "draftgate:prompt_tokens",
    "draftgate:generation_tokens",
]
HISTOGRAMS = [
    "draftgate:time_to_first_token_seconds",
    "draftgate:inter_token_latency_seconds",
    "draftgate:e2e_request_latency_seconds",
    "draftgate:spec_decode_draft_time_seconds",
    "draftgate:spec_decode_verify_time_seconds",
]
GAUGES = [
    "draftgate:kv_blocks_used",
    "draftgate:kv_blocks_free",
    "draftgate:speculation_enabled",
    "draftgate:num_requests_running",
    "draftgate:num_requests_waiting",
]


def test_metrics_after_requests(gateway: Gateway, http: httpx.Client) -> None:
    before = {
        r: metric(gateway, "draftgate:spec_decode_num_draft_tokens_total", model_name=r)
        for r in ("tiny-ngram", "tiny-plain")
    }
    gen_before = metric(gateway, "draftgate:generation_tokens_total", model_name="tiny-ngram")
    usage = {"prompt": 0, "completion": 0}
    for stream in (False, True):
        for route in ("tiny-ngram", "tiny-plain"):
            body = {"model": route, "messages": MSG, "max_tokens": 40, "temperature": 0, "stream": stream}
            r = http.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
            if route == "tiny-ngram" and not stream:
                usage["prompt"] += r.json()["usage"]["prompt_tokens"]
                usage["completion"] += r.json()["usage"]["completion_tokens"]

    r = httpx.get(gateway.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in COUNTERS + HISTOGRAMS + GAUGES:
        assert name in families, f"{name} missing from /metrics"
    # labelled by route, with the right counts
    drafted = metric(gateway, "draftgate:spec_decode_num_draft_tokens_total", model_name="tiny-ngram")
    assert drafted > before["tiny-ngram"]
    assert (
        metric(gateway, "draftgate:spec_decode_num_draft_tokens_total", model_name="tiny-plain") == before["tiny-plain"]
    )
    accepted = metric(gateway, "draftgate:spec_decode_num_accepted_tokens_total", model_name="tiny-ngram")
    assert 0 <= accepted <= drafted
    assert metric(gateway, "draftgate:spec_decode_num_drafts_total", model_name="tiny-ngram") > 0
    assert (
        metric(gateway, "draftgate:generation_tokens_total", model_name="tiny-ngram")
        > gen_before + usage["completion"] - 1
    )
    ok = sum(
        metric(gateway, "draftgate:request_success_total", model_name="tiny-plain", finished_reason=reason)
        for reason in ("stop", "length")
    )
    assert ok >= 2
    assert metric(gateway, "draftgate:time_to_first_token_seconds_count", model_name="tiny-plain") >= 2
    assert metric(gateway, "draftgate:e2e_request_latency_seconds_count", model_name="tiny-ngram") >= 2
    # per-position acceptance: position 0 accepts at least as often as position 1
    p0 = metric(
        gateway, "draftgate:spec_decode_num_accepted_tokens_per_pos_total", model_name="tiny-ngram", position="0"
    )
    p1 = metric(
        gateway, "draftgate:spec_decode_num_accepted_tokens_per_pos_total", model_name="tiny-ngram", position="1"
    )
    assert p0 >= p1
    # gauges, read from the engines on scrape
    assert metric(gateway, "draftgate:speculation_enabled", model_name="tiny-ngram") == 1.0
    assert metric(gateway, "draftgate:speculation_enabled", model_name="tiny-plain") == 0.0
    engine = gateway.engine("tiny-plain")
    assert metric(gateway, "draftgate:kv_blocks_free", model_name="tiny-plain") == engine.kv_stats()["free_blocks"]
    assert metric(gateway, "draftgate:num_requests_running", model_name="tiny-plain") == 0.0


def test_speculation_switch_is_per_route_and_exported(gateway: Gateway, http: httpx.Client) -> None:
    route = gateway.routes.get("tiny-ngram")
    assert route is not None
    body = {"model": "tiny-ngram", "messages": MSG, "max_tokens": 30, "temperature": 0}
    on = http.post("/v1/chat/completions", json=body).json()
    route.set_enabled(False)  # what the admin kill switch does
    try:
        assert metric(gateway, "draftgate:speculation_enabled", model_name="tiny-ngram") == 0.0
        off = http.post("/v1/chat/completions", json=body).json()
    finally:
        route.set_enabled(True)
    assert off["speculative"]["draft_tokens"] == 0
    assert off["choices"][0]["message"]["content"] == on["choices"][0]["message"]["content"]
    assert metric(gateway, "draftgate:speculation_enabled", model_name="tiny-ngram") == 1.0


def test_metrics_and_health_need_no_key(gateway: Gateway) -> None:
    assert httpx.get(gateway.url + "/metrics").status_code == 200
    assert httpx.get(gateway.url + "/health").status_code == 200
