"""The official openai client against a live gateway: chat and completions, streaming and not."""

from __future__ import annotations

import json

import httpx
import pytest
from gateway_support import Gateway

from draftgate.types import SpecStats

MESSAGES = [
    {"role": "system", "content": "the an is of"},
    {"role": "user", "content": "hello world the an is of and hello world"},
]
SPEC_KEYS = {"drafter", "draft_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length"}
N = 24


def _spec(obj: object) -> dict:
    extra = getattr(obj, "model_extra", None) or {}
    assert "speculative" in extra, f"no speculative extension in {obj}"
    spec = extra["speculative"]
    assert set(spec) >= SPEC_KEYS
    return spec


def _chat_stream(gateway: Gateway, model: str, **kw: object) -> tuple[str, list]:
    with gateway.openai() as client:
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=MESSAGES,
                max_tokens=N,
                temperature=0,
                stream=True,
                **kw,  # type: ignore[arg-type]
            )
        )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_health_and_models(gateway: Gateway) -> None:
    assert httpx.get(gateway.url + "/health").json()["status"] == "ok"
    with gateway.openai() as client:
        ids = [m.id for m in client.models.list().data]
    assert ids == gateway.routes.names


@pytest.mark.parametrize("model", ["tiny", "tiny-ngram"])
def test_chat_stream_equals_non_stream_and_plain(gateway: Gateway, model: str) -> None:
    with gateway.openai() as client:
        full = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=N, temperature=0)
        plain = client.chat.completions.create(model="tiny-plain", messages=MESSAGES, max_tokens=N, temperature=0)
    text, chunks = _chat_stream(gateway, model, stream_options={"include_usage": True})
    assert full.object == "chat.completion" and full.model == model
    assert full.choices[0].message.role == "assistant"
    assert full.choices[0].message.content == text  # streamed == non-streamed (greedy)
    assert full.choices[0].message.content == plain.choices[0].message.content  # speculative == plain (lossless)
    assert full.choices[0].message.content
    # usage: the prompt is what the engine encodes; finish by length means exactly N tokens
    n_prompt = len(gateway.engine(model).encode(MESSAGES))
    u = full.usage
    assert u is not None and u.prompt_tokens == n_prompt
    if full.choices[0].finish_reason == "length":
        assert u.completion_tokens == N
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # the stream: role first, one finish chunk with the extension, then the usage chunk
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == full.choices[0].finish_reason
    _spec(finals[0])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == u.model_dump()
    spec = _spec(full)
    assert spec["drafter"] == ("auto" if model == "tiny" else "ngram")
    assert spec["accepted_tokens"] <= spec["draft_tokens"]
    assert spec["mean_accepted_length"] >= 1.0


def test_chat_plain_route_reports_no_drafts(gateway: Gateway) -> None:
    with gateway.openai() as client:
        full = client.chat.completions.create(model="tiny-plain", messages=MESSAGES, max_tokens=8, temperature=0)
    spec = _spec(full)
    assert spec["drafter"] == "none" and spec["draft_tokens"] == 0 and spec["mean_accepted_length"] == 1.0


def test_ngram_route_drafts(gateway: Gateway) -> None:
    with gateway.openai() as client:
        full = client.chat.completions.create(model="tiny-ngram", messages=MESSAGES, max_tokens=40, temperature=0)
    spec = _spec(full)
    assert spec["draft_tokens"] > 0, spec
    s = SpecStats(draft_tokens=spec["draft_tokens"], accepted_tokens=spec["accepted_tokens"])
    assert spec["acceptance_rate"] == round(s.acceptance_rate, 4)


@pytest.mark.parametrize("model", ["tiny", "tiny-plain"])
def test_completions_stream_equals_non_stream(gateway: Gateway, model: str) -> None:
    prompt = "hello world the an is of and hello world"
    with gateway.openai() as client:
        full = client.completions.create(model=model, prompt=prompt, max_tokens=N, temperature=0)
        chunks = list(
            client.completions.create(
                model=model,
                prompt=[prompt],
                max_tokens=N,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        plain = client.completions.create(model="tiny-plain", prompt=prompt, max_tokens=N, temperature=0)
    assert full.object == "text_completion"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert full.choices[0].text == text == plain.choices[0].text
    assert full.usage is not None
    assert full.usage.prompt_tokens == len(gateway.engine(model).encode(prompt, raw=True))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    _spec(full)
    _spec(next(c for c in chunks if c.choices and c.choices[0].finish_reason))


def test_completions_token_ids_prompt(gateway: Gateway) -> None:
    ids = gateway.engine("tiny").encode("hello world the", raw=True)
    with gateway.openai() as client:
        by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
        by_text = client.completions.create(model="tiny", prompt="hello world the", max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_seeded_sampling_is_reproducible_and_lossless(gateway: Gateway) -> None:
    kw = {"messages": MESSAGES, "max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": 7}
    with gateway.openai() as client:
        a = client.chat.completions.create(model="tiny-ngram", **kw)  # type: ignore[arg-type]
        b = client.chat.completions.create(model="tiny-ngram", **kw)  # type: ignore[arg-type]
        c = client.chat.completions.create(model="tiny-plain", extra_body={"top_k": 20}, **kw)  # type: ignore[arg-type]
        d = client.chat.completions.create(model="tiny-ngram", extra_body={"top_k": 20}, **kw)  # type: ignore[arg-type]
    assert a.choices[0].message.content == b.choices[0].message.content
    assert c.choices[0].message.content == d.choices[0].message.content


def test_stop_string_and_max_completion_tokens(gateway: Gateway) -> None:
    with gateway.openai() as client:
        ref = client.chat.completions.create(model="tiny-plain", messages=MESSAGES, max_tokens=N, temperature=0)
        words = (ref.choices[0].message.content or "").split()
        assert len(words) > 3
        stopped = client.chat.completions.create(
            model="tiny-ngram", messages=MESSAGES, max_completion_tokens=N, temperature=0, stop=[words[3]]
        )
        capped = client.chat.completions.create(model="tiny", messages=MESSAGES, max_completion_tokens=3, temperature=0)
    assert stopped.choices[0].finish_reason == "stop"
    assert words[3] not in (stopped.choices[0].message.content or "").split()
    assert capped.usage is not None and capped.usage.completion_tokens <= 3


def test_raw_sse_framing(gateway: Gateway, http: httpx.Client) -> None:
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and "speculative" in last
    assert "usage" not in last  # only with stream_options.include_usage


def test_openapi_schema_documents_bodies(gateway: Gateway) -> None:
    schema = httpx.get(gateway.url + "/openapi.json").json()
    assert "ChatRequest" in schema["components"]["schemas"]
    assert "ChatMessage" in schema["components"]["schemas"]
