"""Bad input gets a 4xx in OpenAI's error shape and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from gateway_support import Gateway
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
OK_MSG = [{"role": "user", "content": "hello"}]


def assert_error(r: httpx.Response, status: int, param: str | None = "-", code: str | None = "-") -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error"
    if param != "-":
        assert err["param"] == param, err
    if code != "-":
        assert err["code"] == code, err
    return err


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": OK_MSG, "max_tokens": 2, **kw}


RAW_BODIES: list[tuple[str, bytes]] = [
    ("malformed json", b'{"model": "tiny", "messages": ['),
    ("not json", b"hello"),
    ("empty body", b""),
    ("json array", b"[1, 2]"),
    ("json string", b'"tiny"'),
    ("invalid utf-8", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    ("nan", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'),
    ("deep nesting", b"[" * 5000 + b"]" * 5000),
]


@pytest.mark.parametrize("body", [b for _, b in RAW_BODIES], ids=[n for n, _ in RAW_BODIES])
def test_unparseable_bodies(http: httpx.Client, after_check: Callable[[], None], body: bytes) -> None:
    r = http.post(CHAT, content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 400)


BAD_FIELDS: list[tuple[str, dict[str, Any], str | None]] = [
    ("missing messages", {"model": "tiny"}, "messages"),
    ("missing model", {"messages": OK_MSG}, "model"),
    ("empty messages", chat(messages=[]), "messages"),
    ("messages not a list", chat(messages="hello"), "messages"),
    ("message without content", chat(messages=[{"role": "user"}]), "messages[0].content"),
    ("unknown role", chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    ("content wrong type", chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (
        "image part",
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content",
    ),
    ("max_tokens string", chat(max_tokens="10"), "max_tokens"),
    ("max_tokens float", chat(max_tokens=1.5), "max_tokens"),
    ("max_tokens negative", chat(max_tokens=-1), "max_tokens"),
    ("max_tokens zero", chat(max_tokens=0), "max_tokens"),
    ("max_tokens enormous", chat(max_tokens=10**12), "max_tokens"),
    ("max_completion_tokens enormous", chat(max_completion_tokens=2**40), "max_completion_tokens"),
    ("temperature negative", chat(temperature=-0.5), "temperature"),
    ("temperature absurd", chat(temperature=1e9), "temperature"),
    ("temperature string", chat(temperature="hot"), "temperature"),
    ("top_p zero", chat(top_p=0), "top_p"),
    ("top_p above one", chat(top_p=1.5), "top_p"),
    ("top_k negative", chat(top_k=-5), "top_k"),
    ("seed negative", chat(seed=-1), "seed"),
    ("seed huge", chat(seed=2**70), "seed"),
    ("stop empty", chat(stop=[""]), "stop"),
    ("stop wrong type", chat(stop=5), "stop"),
    ("stop too many", chat(stop=[str(i) for i in range(20)]), "stop"),
    ("n two", chat(n=2), "n"),
    ("stream not bool", chat(stream="yes"), "stream"),
    ("logprobs", chat(logprobs=True), "logprobs"),
    ("tools", chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
    ("penalty", chat(presence_penalty=1.0), "presence_penalty"),
]


@pytest.mark.parametrize("body,param", [(b, p) for _, b, p in BAD_FIELDS], ids=[n for n, _, _ in BAD_FIELDS])
def test_bad_chat_fields(http: httpx.Client, after_check: Callable[[], None], body: dict, param: str | None) -> None:
    assert_error(http.post(CHAT, json=body), 400, param=param)


BAD_TEXT: list[tuple[str, dict[str, Any]]] = [
    ("two prompts", {"model": "tiny", "prompt": ["a", "b"]}),
    ("empty prompt list", {"model": "tiny", "prompt": []}),
    ("prompt wrong type", {"model": "tiny", "prompt": 5}),
    ("prompt mixed list", {"model": "tiny", "prompt": ["a", 1]}),
    ("token id out of range", {"model": "tiny", "prompt": [1, 2, 10**6]}),
    ("empty prompt text", {"model": "tiny", "prompt": ""}),
    ("echo", {"model": "tiny", "prompt": "hello", "echo": True}),
    ("best_of", {"model": "tiny", "prompt": "hello", "best_of": 3}),
]


@pytest.mark.parametrize("body", [b for _, b in BAD_TEXT], ids=[n for n, _ in BAD_TEXT])
def test_bad_completion_fields(http: httpx.Client, after_check: Callable[[], None], body: dict) -> None:
    assert_error(http.post(TEXT, json=body), 400)


def test_unknown_model_is_404(http: httpx.Client, after_check: Callable[[], None]) -> None:
    err = assert_error(http.post(CHAT, json=chat(model="gpt-17")), 404, param="model", code="model_not_found")
    assert "gpt-17" in err["message"]
    assert_error(http.post(TEXT, json={"model": "nope", "prompt": "x"}), 404, code="model_not_found")


def test_prompt_longer_than_context(gateway: Gateway, http: httpx.Client, after_check: Callable[[], None]) -> None:
    ctx = gateway.routes.get("tiny").context_length  # type: ignore[union-attr]
    assert ctx is not None
    long_text = " ".join(["hello"] * (ctx + 10))
    assert_error(http.post(CHAT, json=chat(messages=[{"role": "user", "content": long_text}], max_tokens=None)), 400)
    assert_error(http.post(TEXT, json={"model": "tiny", "prompt": long_text}), 400)
    assert_error(http.post(TEXT, json={"model": "tiny", "prompt": "hello", "max_tokens": ctx}), 400)
    # streaming requests fail the same way, before any event is sent
    r = http.post(CHAT, json=chat(messages=[{"role": "user", "content": long_text}], stream=True))
    assert_error(r, 400)


def test_body_too_large(http: httpx.Client, after_check: Callable[[], None]) -> None:
    body = json.dumps(chat(messages=[{"role": "user", "content": "a" * (5 << 20)}]))
    assert_error(http.post(CHAT, content=body, headers={"Content-Type": "application/json"}), 413)


def test_unknown_path_and_method(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get(CHAT), 405)


def test_extensions_and_ignored_fields_accepted(http: httpx.Client, after_check: Callable[[], None]) -> None:
    body = chat(
        top_k=-1,
        ignore_eos=True,
        user="u1",
        metadata={"a": "b"},
        stream_options=None,
        logprobs=False,
        presence_penalty=0,
        tool_choice="none",
        n=1,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "hi"}]}, *OK_MSG],
    )
    r = http.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2  # ignore_eos: exactly max_tokens


# ------------------------------------------------------------------ fuzz

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "x"]) | _scalars},
    optional={"content": st.text(alphabet="helo wrdtanis", max_size=40) | _json, "name": _json},
)
_bodies = (
    st.fixed_dictionaries(
        {"max_tokens": st.integers(1, 6) | _json},  # a valid body generates a few tokens, never hundreds
        optional={
            "model": st.sampled_from(["tiny", "tiny-ngram", "tiny-plain", "nope"]) | _json,
            "messages": st.lists(_message, max_size=3) | _json,
            "temperature": st.floats(-1, 3) | _json,
            "top_p": st.floats(-0.5, 1.5) | _json,
            "top_k": st.integers(-3, 200) | _json,
            "seed": st.integers(-5, 2**64) | _json,
            "stop": st.lists(st.text(max_size=3), max_size=3) | _json,
            "stream": st.booleans() | _json,
            "n": st.integers(0, 3) | _json,
            "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | _json,
            "logprobs": _json,
        },
    )
    | _json
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(body=_bodies)
def test_fuzz_chat_never_5xx(http: httpx.Client, body: Any) -> None:
    r = http.post(CHAT, json=body)  # one client for all examples (the fixture is shared on purpose)
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code >= 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert http.get("/health").status_code == 200


def test_server_alive_after_fuzz(gateway: Gateway, after_check: Callable[[], None]) -> None:
    with gateway.http() as c:
        assert c.get("/health").json()["status"] == "ok"
