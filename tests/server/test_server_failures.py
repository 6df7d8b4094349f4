"""Failure paths: client disconnect, engine errors, a full queue. Nothing leaks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest
from gateway_support import WAIT_S, Gateway, assert_no_leaks, metric

from draftgate.engine import Engine

CHAT = "/v1/chat/completions"
LONG = {"max_tokens": 200, "ignore_eos": True, "temperature": 0}  # runs long enough to be cut off
MSG = [{"role": "user", "content": "hello world the an is of"}]


def events(r: httpx.Response) -> Iterator[dict]:
    """The stream's events. Keep the iterator while the stream should live: when it is
    garbage collected, httpx closes the connection (which the server sees as a disconnect)."""
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def patched_forward(engine: Engine, fail_after: int | None = None, delay_s: float = 0.0) -> Iterator[None]:
    """The engine's target forward sleeps ``delay_s`` (so a request is surely still running when
    the test acts) and fails after ``fail_after`` calls; restored and leak-checked at exit."""
    runner = engine.runner
    real = runner.forward_flat
    calls = {"n": 0}

    def forward(items):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise RuntimeError("injected target failure")
        time.sleep(delay_s)
        return real(items)

    runner.forward_flat = forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        del runner.forward_flat  # back to the class's method
        assert_no_leaks(engine)


@pytest.mark.parametrize("route", ["tiny-ngram", "tiny"])
def test_disconnect_mid_stream_cancels_and_frees(gateway: Gateway, http: httpx.Client, route: str) -> None:
    engine = gateway.engine(route)
    aborts = metric(gateway, "draftgate:request_failure_total", model_name=route, reason="abort")
    body = {"model": route, "messages": MSG, "stream": True, **LONG}
    with patched_forward(engine, delay_s=0.02), http.stream("POST", CHAT, json=body) as r:
        assert r.status_code == 200
        stream = events(r)
        assert next(stream)["choices"][0]["delta"]["role"] == "assistant"
        wait_for(lambda: engine.num_running == 1, "the request to run")
    # the client is gone: the engine request is cancelled and its KV blocks freed
    wait_for(lambda: engine.num_running == 0 and engine.num_waiting == 0, "the engine to drop the request")
    assert_no_leaks(engine)
    wait_for(
        lambda: metric(gateway, "draftgate:request_failure_total", model_name=route, reason="abort") == aborts + 1,
        "the abort to be counted",
    )
    r2 = http.post(CHAT, json={"model": route, "messages": MSG, "max_tokens": 3})
    assert r2.status_code == 200


def test_disconnect_while_waiting_for_a_non_streamed_answer(gateway: Gateway) -> None:
    engine = gateway.engine("tiny-plain")
    aborts = metric(gateway, "draftgate:request_failure_total", model_name="tiny-plain", reason="abort")
    body = {"model": "tiny-plain", "messages": MSG, **LONG}
    with patched_forward(engine, delay_s=0.02), gateway.http(timeout=0.5) as c:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            c.post(CHAT, json=body)
        wait_for(lambda: engine.num_running == 0 and engine.num_waiting == 0, "the engine to drop the request")
    wait_for(
        lambda: (
            metric(gateway, "draftgate:request_failure_total", model_name="tiny-plain", reason="abort") == aborts + 1
        ),
        "the abort to be counted",
    )


def test_engine_error_is_500_then_recovers(gateway: Gateway, http: httpx.Client) -> None:
    body = {"model": "tiny-broken", "messages": MSG, "max_tokens": 5}
    with patched_forward(gateway.engine("tiny-broken"), fail_after=0):
        r = http.post(CHAT, json=body)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["type"] == "server_error" and "injected target failure" in err["message"]
    assert http.post(CHAT, json=body).status_code == 200


def test_engine_error_mid_stream_is_an_error_event(gateway: Gateway) -> None:
    with (
        patched_forward(gateway.engine("tiny-broken"), fail_after=1),
        gateway.openai() as client,
    ):  # prefill works, the next round fails
        stream = client.chat.completions.create(
            model="tiny-broken",
            messages=MSG,
            stream=True,
            max_tokens=200,
            temperature=0,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True},
        )
        with pytest.raises(openai.APIError, match="injected target failure"):
            for _ in stream:
                pass
    with gateway.openai() as client:
        ok = client.chat.completions.create(model="tiny-broken", messages=MSG, max_tokens=3)  # type: ignore[arg-type]
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_full_queue_is_429_with_retry_after(gateway: Gateway, http: httpx.Client) -> None:
    engine = gateway.engine("tiny-tight")  # one running, one waiting at most
    body = {"model": "tiny-tight", "messages": MSG, **LONG}
    with patched_forward(engine, delay_s=0.02), gateway.http() as other:
        with http.stream("POST", CHAT, json={**body, "stream": True}) as running:
            running_events = events(running)
            next(running_events)
            wait_for(lambda: engine.num_running == 1, "the first request to run")
            with other.stream("POST", CHAT, json={**body, "stream": True}) as waiting:
                waiting_events = events(waiting)
                next(waiting_events)  # submitted (its first event came after submit)
                assert engine.num_waiting == 1
                with gateway.http() as third:
                    for stream in (False, True):
                        r = third.post(CHAT, json={**body, "stream": stream})
                        assert r.status_code == 429, r.text
                        assert int(r.headers["Retry-After"]) >= 1
                        assert r.json()["error"]["type"] == "rate_limit_error"
    wait_for(lambda: engine.num_running == 0 and engine.num_waiting == 0, "both to be dropped")
    assert_no_leaks(engine)
    assert http.post(CHAT, json={**body, "max_tokens": 2}).status_code == 200
    assert metric(gateway, "draftgate:request_failure_total", model_name="tiny-tight", reason="capacity") >= 2
