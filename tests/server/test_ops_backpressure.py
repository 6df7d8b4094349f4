"""Back-pressure: a full queue answers 429 + Retry-After (never 5xx); when KV blocks run out,
requests wait for admission and still produce exactly the plain greedy output; KV returns to baseline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gateway_support import CLIENT_KEY, WAIT_S, Gateway, assert_no_leaks, serve_app, tiny_engine

from draftgate.engine import DrafterKind, Engine
from draftgate.models.loader import LoadedModel
from draftgate.server import AuthConfig, Route, RouteTable, create_app

PROMPTS = [f"hello world the {w} is of hello world" for w in ("an", "is", "of", "and", "the", "world")]


@pytest.fixture(scope="module")
def bp(tiny_model: LoadedModel) -> Iterator[Gateway]:
    routes = RouteTable.of(
        [
            Route("bp-tight", tiny_engine(tiny_model, DrafterKind.NONE, max_batch=1, max_queue=1), model="tiny"),
            # 5 blocks per request (8 prompt + 20 + k_max 8 + 1 tokens, 8 per block): two fit at once
            Route("bp-fewkv", tiny_engine(tiny_model, DrafterKind.NGRAM, k=4, num_blocks=14), model="tiny"),
            Route("bp-plain", tiny_engine(tiny_model, DrafterKind.NONE), model="tiny"),
        ]
    )
    app = create_app(routes, AuthConfig(api_keys=frozenset({CLIENT_KEY})))
    try:
        with serve_app(app) as url:
            yield Gateway(url, routes, app)
    finally:
        routes.close()


def slow_forward(engine: Engine, delay_s: float) -> None:
    real = engine.runner.forward_flat

    def forward(items):  # type: ignore[no-untyped-def]
        time.sleep(delay_s)
        return real(items)

    engine.runner.forward_flat = forward  # type: ignore[method-assign]


def post(url: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=WAIT_S) as c:
        return c.post("/v1/completions", json=body)


def test_flooding_a_tight_route_gives_429_with_retry_after_and_no_5xx(bp: Gateway) -> None:
    engine = bp.engine("bp-tight")
    slow_forward(engine, 0.01)
    try:
        body = {"model": "bp-tight", "prompt": "hello world", "max_tokens": 20, "ignore_eos": True}
        with ThreadPoolExecutor(12) as pool:
            first = pool.submit(post, bp.url, {**body, "max_tokens": 60})
            deadline = time.monotonic() + WAIT_S
            while engine.num_running == 0:  # the flood arrives while one request runs (max_batch 1)
                assert time.monotonic() < deadline, "the first request never started"
                time.sleep(0.002)
            answers = [first.result(), *pool.map(lambda _: post(bp.url, body), range(11))]
    finally:
        del engine.runner.forward_flat
    codes = [r.status_code for r in answers]
    assert all(c in (200, 429) for c in codes), codes
    assert codes.count(200) >= 2 and codes.count(429) >= 1, codes  # one running + one queued at least
    for r in answers:
        if r.status_code == 429:
            assert r.headers["Retry-After"].isdigit()
            assert r.json()["error"]["code"] == "queue_full"
    assert_no_leaks(engine)
    assert post(bp.url, body).status_code == 200  # still serving


def test_requests_wait_for_kv_blocks_and_stay_exact(bp: Gateway) -> None:
    engine = bp.engine("bp-fewkv")
    baseline = engine.kv_stats()
    body = {"max_tokens": 20, "temperature": 0, "ignore_eos": True}
    expected = [post(bp.url, {**body, "model": "bp-plain", "prompt": p}).json() for p in PROMPTS]
    peak = {"waiting": 0}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        futs = [pool.submit(post, bp.url, {**body, "model": "bp-fewkv", "prompt": p}) for p in PROMPTS]
        while not all(f.done() for f in futs):
            peak["waiting"] = max(peak["waiting"], engine.num_waiting)
            assert engine.num_running <= 2  # admission never over-commits the 14 blocks
            time.sleep(0.002)
        answers = [f.result() for f in futs]
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert [r.json()["choices"][0]["text"] for r in answers] == [e["choices"][0]["text"] for e in expected]
    assert peak["waiting"] >= 1  # some requests did wait for blocks
    assert_no_leaks(engine)
    after = engine.kv_stats()
    assert after["sequences"] == baseline["sequences"] == 0
    assert after["free_blocks"] + after["cached_blocks"] == after["num_blocks"]
