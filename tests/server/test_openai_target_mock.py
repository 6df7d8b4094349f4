"""OpenAITargetEngine against a fake server with llama-cpp-python's echo+logprobs layout (no llama.cpp).

The fake server's "model" is a deterministic rule over token ids; its answers
follow llama-cpp-python 0.3.x exactly as openai_target documents it (a leading
BOS dropped from the echoed list, every other BOS-id token skipped, the first
entry null, top_logprobs keyed by token string plus the echoed token's own
entry). Greedy output through the back end must equal the rule's own greedy
continuation, whatever the drafter proposes.
"""

from __future__ import annotations

import json
import queue
from collections.abc import Sequence

import httpx
import pytest

from draftgate.drafters import NgramDrafter
from draftgate.drafters.base import Abilities, Draft, DraftRequest
from draftgate.models.loader import LoadedModel
from draftgate.server.targets.openai_engine import OpenAITargetEngine
from draftgate.server.targets.openai_target import TokenPieces
from draftgate.types import SamplingParams


class RuleServer:
    def __init__(self, loaded: LoadedModel) -> None:
        self.tok = loaded.tokenizer
        self.pieces = TokenPieces(self.tok)
        self.words = [i for i in range(4, 40)]  # plain word ids of the tiny vocabulary
        self.requests = 0
        self.eos_at: int | None = None  # the rule emits EOS when the history has this many tokens

    def next(self, ids: Sequence[int]) -> int:
        if self.eos_at is not None and len(ids) == self.eos_at:
            return self.tok.eos_ids[0]
        return self.words[(ids[-1] * 31 + len(ids) * 7) % len(self.words)]

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out = list(ids)
        for _ in range(n):
            out.append(self.next(out))
        return out[len(ids) :]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        body = json.loads(request.content)
        assert body["echo"] is True and body["max_tokens"] == 1 and body["temperature"] == 0.0
        ids = self.tok.encode(body["prompt"], add_special=False)
        bos = self.tok.bos_id
        completion = self.next(ids)
        off = 1 if ids[0] == bos else 0
        eog = completion in self.tok.eos_ids
        all_tokens = ids[off:] + ([] if eog else [completion])  # llama-cpp-python drops an EOS completion
        tokens, tops = [], []
        for j in range(min(len(ids), len(all_tokens))):  # score row j: the distribution after ids[: j + 1]
            t = all_tokens[j]
            if t == bos:
                continue
            best = self.next(ids[: j + 1])
            top = {self.pieces.pieces[best]: -0.1}
            top.update({self.pieces.pieces[t]: -0.1 if t == best else -7.0})
            tokens.append(self.pieces.pieces[t])
            tops.append(top)
        tops[0] = None
        lp = {
            "tokens": tokens,
            "top_logprobs": tops,
            "token_logprobs": [None] * len(tokens),
            "text_offset": [0] * len(tokens),
        }
        data = {
            "choices": [{"text": "", "logprobs": lp, "finish_reason": "stop" if eog else "length"}],
            "usage": {"prompt_tokens": len(ids)},
        }
        return httpx.Response(200, json=data)


def fake_engine(server: RuleServer, drafter: object, **kw: object) -> OpenAITargetEngine:
    """OpenAITargetEngine over the fake server (k = 4 unless given)."""
    kw.setdefault("k", 4)
    client = httpx.Client(transport=httpx.MockTransport(server))
    return OpenAITargetEngine("http://fake", server.tok, drafter, client=client, **kw)  # type: ignore[arg-type]


class HalfRightDrafter:
    """Proposes the rule's true next tokens, then a wrong one: exercises accept + reject in one round."""

    name = "halfright"
    sampled_q = False
    abilities = Abilities()

    def __init__(self, server: RuleServer) -> None:
        self.server = server

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            good = self.server.greedy(list(r.tokens), max(0, r.k - 1))
            wrong = (
                self.server.words[0]
                if self.server.next(list(r.tokens) + good) != self.server.words[0]
                else self.server.words[1]
            )
            out.append(Draft((good + [wrong])[: r.k]))
        return out

    def observe(self, *a: object) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


def _run(eng: OpenAITargetEngine, ids: list[int], n: int) -> tuple[list[int], object]:
    q: queue.SimpleQueue = queue.SimpleQueue()
    eng.submit(ids, SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True), q.put)
    toks: list[int] = []
    while True:
        c = q.get(timeout=30)
        toks.extend(c.token_ids)
        if c.finish_reason is not None:
            assert c.finish_reason == "length", c.error
            return toks, c.stats


@pytest.mark.parametrize("drafter", ["ngram", "halfright", "none"])
@pytest.mark.parametrize("chat", [False, True])
def test_greedy_equals_the_servers_greedy(tiny_model: LoadedModel, drafter: str, chat: bool) -> None:
    server = RuleServer(tiny_model)
    d = {"ngram": NgramDrafter(), "halfright": HalfRightDrafter(server), "none": None}[drafter]
    eng = fake_engine(server, d)
    try:
        if chat:
            ids = tiny_model.tokenizer.encode_chat([{"role": "user", "content": "hello world the"}])
        else:
            ids = tiny_model.tokenizer.encode("a b c a b c a b", add_special=False)
        got, stats = _run(eng, ids, 20)
        assert got == server.greedy(ids, 20)
        if drafter == "halfright":
            assert stats.accepted_tokens > 0 and stats.accepted_tokens < stats.draft_tokens  # type: ignore[attr-defined]
            assert server.requests < 20  # fewer server calls than tokens
    finally:
        eng.shutdown()


def test_approximate_mode_is_flagged(tiny_model: LoadedModel) -> None:
    server = RuleServer(tiny_model)
    eng = fake_engine(server, NgramDrafter(), allow_approximate=True)
    try:
        q: queue.SimpleQueue = queue.SimpleQueue()
        ids = tiny_model.tokenizer.encode("a b c a b c a b", add_special=False)
        eng.submit(ids, SamplingParams(temperature=0.8, max_new_tokens=8, ignore_eos=True, seed=1), q.put)
        while (c := q.get(timeout=30)).finish_reason is None:
            pass
        assert c.finish_reason == "length", c.error
        assert getattr(c.stats, "approximate", False) is True and eng.approximate_requests == 1
    finally:
        eng.shutdown()


@pytest.mark.parametrize("chat", [False, True])
def test_server_eos_ends_the_request(tiny_model: LoadedModel, chat: bool) -> None:
    server = RuleServer(tiny_model)
    eng = fake_engine(server, HalfRightDrafter(server))
    try:
        if chat:
            ids = tiny_model.tokenizer.encode_chat([{"role": "user", "content": "hello world the"}])
        else:
            ids = tiny_model.tokenizer.encode("a b c a b c a b", add_special=False)
        server.eos_at = len(ids) + 6
        q: queue.SimpleQueue = queue.SimpleQueue()
        eng.submit(ids, SamplingParams(temperature=0.0, max_new_tokens=20), q.put)
        toks: list[int] = []
        while (c := q.get(timeout=30)).finish_reason is None:
            toks.extend(c.token_ids)
        toks.extend(c.token_ids)
        assert c.finish_reason == "stop", c.error
        assert toks == server.greedy(ids, 7) and toks[-1] == tiny_model.tokenizer.eos_ids[0]
    finally:
        eng.shutdown()


def test_approximate_requests_are_marked_in_the_response_and_counted_in_metrics(tiny_model: LoadedModel) -> None:
    """Approximate mode is never invisible: ``speculative.approximate`` on the response and a counter."""
    from gateway_support import CLIENT_KEY, metric, serve_app

    from draftgate.server import AuthConfig, Route, RouteTable, create_app

    server = RuleServer(tiny_model)
    eng = fake_engine(server, NgramDrafter(), allow_approximate=True)
    routes = RouteTable.of([Route("approx", eng, model="tiny")])
    try:
        with serve_app(create_app(routes, AuthConfig(api_keys=frozenset({CLIENT_KEY})))) as url:
            gw = type("G", (), {"url": url})()
            h = {"Authorization": f"Bearer {CLIENT_KEY}"}
            name = "draftgate:spec_decode_approximate_requests_total"
            for temperature, approx in ((0.0, False), (0.8, True)):
                before = metric(gw, name, model_name="approx")  # type: ignore[arg-type]
                r = httpx.post(
                    url + "/v1/completions",
                    headers=h,
                    timeout=30,
                    json={
                        "model": "approx",
                        "prompt": "a b c a b c a b",
                        "max_tokens": 6,
                        "temperature": temperature,
                        "seed": 3,
                        "ignore_eos": True,
                    },
                )
                assert r.status_code == 200, r.text
                assert r.json()["speculative"]["approximate"] is approx
                assert metric(gw, name, model_name="approx") == before + approx  # type: ignore[arg-type]
    finally:
        routes.close()


@pytest.mark.parametrize("drafter", ["halfright", "none"])
def test_an_ambiguous_server_token_ends_the_request_clearly_never_a_guess(
    tiny_model: LoadedModel, drafter: str
) -> None:
    """The server's choice prints like several ids (here <pad>, which prints "" like BOS and EOS):
    which one it chose is unknown. Reading "" as EOS ended the request early with finish "stop";
    now the tokens before it are exact and the request ends with an error that says why."""
    server = RuleServer(tiny_model)
    ids = tiny_model.tokenizer.encode("a b c a b c a b", add_special=False)
    pad_at = len(ids) + 5
    rule = server.next
    server.next = lambda h: 0 if len(h) == pad_at else rule(h)  # type: ignore[method-assign]
    d = HalfRightDrafter(server) if drafter == "halfright" else None
    eng = fake_engine(server, d)
    try:
        q: queue.SimpleQueue = queue.SimpleQueue()
        eng.submit(ids, SamplingParams(temperature=0.0, max_new_tokens=20, ignore_eos=True), q.put)
        toks: list[int] = []
        while (c := q.get(timeout=30)).finish_reason is None:
            toks.extend(c.token_ids)
        assert c.finish_reason == "error" and "prints like 3 ids" in (c.error or "")
        assert toks + list(c.token_ids) == server.greedy(ids, 5)  # exact up to the ambiguous token
    finally:
        eng.shutdown()


@pytest.mark.parametrize("allow_approximate", [False, True])
def test_check_lossless_over_openai_http(tiny_model: LoadedModel, allow_approximate: bool) -> None:
    """Greedy through the scorer is exact; sampling is refused (skipped, with the reason) or, when the
    route allows the approximation, reported as not lossless."""
    from draftgate.bench.check_lossless import CheckConfig, CheckPrompt, check_lossless, render

    server = RuleServer(tiny_model)
    eng = fake_engine(server, HalfRightDrafter(server), allow_approximate=allow_approximate)
    try:
        cases = [
            CheckPrompt(str(i), tiny_model.tokenizer.encode(p, add_special=False))
            for i, p in enumerate(["a b c a b c a b", "hello world the"])
        ]
        report = check_lossless(eng, "openai", cases, CheckConfig(max_new_tokens=16, samples=20, sample_tokens=2))
        greedy = [f for f in report.findings if f.check == "greedy"]
        assert len(greedy) == 2 and all(f.passed for f in greedy), render(report)
        sampling = [f for f in report.findings if f.check != "greedy"]
        if allow_approximate:
            assert not report.passed and "approximately: not lossless" in (report.first_failure.detail or "")  # type: ignore[union-attr]
        else:
            assert report.passed and len(sampling) == 1 and sampling[0].skipped
            assert "refuses sampling" in render(report)
    finally:
        eng.shutdown()
