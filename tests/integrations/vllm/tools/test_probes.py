"""Measurements of a running vLLM, against a fake vLLM served by httpx's mock transport and a fake clock."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator

import httpx
import pytest

from draftgate.integrations.vllm.tools import probes

URL = "http://vllm.test"

METRICS = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 120.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 30.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e+09
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 100.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


class Clock:
    """perf_counter for the probes: time passes only where the fake server says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def _serve(monkeypatch: pytest.MonkeyPatch, handler: httpx.MockTransport) -> None:
    """probes' httpx, routed to ``handler`` (the real httpx module is left untouched)."""
    fake = types.SimpleNamespace(
        get=lambda url, **kw: httpx.Client(transport=handler).get(url, **kw),
        Client=lambda **kw: httpx.Client(transport=handler, **kw),
    )
    monkeypatch.setattr(probes, "httpx", fake)


def test_prefix_cache_sums_the_counters_of_every_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        asked.append(str(req.url))
        return httpx.Response(200, text=METRICS)

    _serve(monkeypatch, httpx.MockTransport(handle))
    assert probes.prefix_cache(URL) == (150.0, 500.0)  # `_created` and other series are not counted
    assert asked == [f"{URL}/metrics"]


def test_prefix_cache_is_zero_before_vllm_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _serve(monkeypatch, httpx.MockTransport(lambda req: httpx.Response(200, text="# nothing yet\n")))
    assert probes.prefix_cache(URL) == (0.0, 0.0)


def test_round_cost_asks_for_each_kind_of_request_and_reports_medians(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(probes, "time", clock)
    bodies: list[dict] = []  # type: ignore[type-arg]
    plain_s = iter([0.050, 0.004, 0.002, 0.003])  # the warm-up (not measured), then median 3 ms
    score_s = iter([0.010, 0.006, 0.007])  # scoring requests: median 7 ms

    def stream() -> Iterator[bytes]:
        # Token arrivals: the first two (after prefill, then the first decode: not steady) and the
        # end marker are no token gaps; the one between the second and third token is, 20 ms.
        for wait, line in [(0.0, "data: {}"), (0.5, "data: {}"), (0.020, "data: {}"), (0.3, "data: [DONE]")]:
            clock.now += wait
            yield f"{line}\n\n".encode()

    def handle(req: httpx.Request) -> httpx.Response:
        assert req.url.path == "/inference/v1/generate"
        body = json.loads(req.content)
        bodies.append(body)
        if body.get("stream"):
            return httpx.Response(200, content=stream())
        clock.now += next(score_s) if body["sampling_params"].get("prompt_logprobs") else next(plain_s)
        return httpx.Response(200, json={"choices": []})

    _serve(monkeypatch, httpx.MockTransport(handle))
    prompt = [11, 12, 13]
    got = probes.round_cost(URL, prompt, k=4, reps=3)
    assert got == pytest.approx({"token_ms": 20.0, "request_ms": 3.0, "score_ms": 7.0, "prompt_tokens": 3, "k": 4})

    warm, streamed, *reps = bodies
    assert warm["token_ids"] == prompt and warm["sampling_params"]["max_tokens"] == 1  # caches the prompt
    assert streamed["token_ids"] == prompt and streamed["sampling_params"]["max_tokens"] == 48
    assert len(reps) == 6
    for i, (one, score) in enumerate(zip(reps[::2], reps[1::2], strict=True)):
        assert one["token_ids"] == [*prompt, 300 + i]  # a fresh last token: one token past the cache
        assert one["sampling_params"]["max_tokens"] == 1 and "prompt_logprobs" not in one["sampling_params"]
        assert score["token_ids"] == [*prompt, 300 + i, 400, 401, 402, 403]  # + k drafts to score
        sp = score["sampling_params"]
        assert sp["prompt_logprobs"] == 1 and sp["skip_reading_prefix_cache"] is False and sp["max_tokens"] == 1
    for body in bodies:
        sp = body["sampling_params"]
        assert sp["temperature"] == 0.0 and sp["ignore_eos"] is True and sp["detokenize"] is False


def test_counters_sum_engines_and_default_to_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    text = METRICS + 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0\n'
    _serve(monkeypatch, httpx.MockTransport(lambda req: httpx.Response(200, text=text)))
    assert probes.prefix_cache(URL) == (150.0, 500.0)
    assert probes.spec_decode(URL) == (7.0, 0.0, 0.0)  # a counter vLLM does not export counts 0
