"""VllmRoundTarget against a fake vLLM token route (httpx MockTransport): plain streams, scored rounds,
faults. The fake model continues a fixed text: after any prefix of TEXT its greedy token is the next
one, and its scoring answer has vLLM's prompt_logprobs rows (rank 1 at the text's token)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from draftgate.drafters.base import Draft
from draftgate.engine import Engine, Round
from draftgate.engine.sequence import PositionRandom, SequenceState, StopChecker
from draftgate.integrations.vllm.gateway.target import VllmRoundTarget
from draftgate.integrations.vllm.gateway.wire import VllmWire
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

V = 64
TEXT = [(7 * i + 3) % 50 + 10 for i in range(400)]  # the fake model's greedy text (ids 10..59)
PROMPT = TEXT[:12]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


class FakeVllm:
    """vLLM's /inference/v1/generate for a model that continues TEXT; counts requests, injects faults.

    A stream sends its first token at once and the rest only while ``flowing`` is set: a scoring
    round then always runs ahead of the stream, as on a real server where a decode step costs ms."""

    def __init__(self) -> None:
        self.scores = 0
        self.streams = 0
        self.fail_scores = False
        self.fail_streams = False
        self.flowing = threading.Event()
        self.ties: set[int] = set()  # positions whose row has a runner-up within 1e-4 of the top
        self.bonus_tie = False  # the scoring request's own token has a runner-up within 1e-4
        self.lies: set[int] = set()  # positions whose row says the prompt's token is vLLM's argmax, clearly
        self.broken_rows: str | None = None  # "list": rows that are not dicts; "vocab": a top-1 outside the vocabulary

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ids, sp = body["token_ids"], body["sampling_params"]
        if body.get("stream"):
            # The model's token at position m is TEXT[m] whatever came before (a lie may have put others in).
            assert self.lies or ids == TEXT[: len(ids)], "a stream must follow the model's own text"
            self.streams += 1
            if self.fail_streams:
                return httpx.Response(500, json={"error": {"message": "stream broke"}})
            out = TEXT[len(ids) : len(ids) + sp["max_tokens"]]
            return httpx.Response(200, content=self._lines(out))
        self.scores += 1
        if self.fail_scores:
            return httpx.Response(500, json={"error": {"message": "scoring broke"}})
        rows: list[object] = [None]
        for m in range(1, len(ids)):  # row m: the model's distribution after ids[:m] (off the text: its text's token)
            want = TEXT[m] if m not in self.lies else ids[m]
            row = {str(want): {"logprob": -0.1, "rank": 1}}
            if ids[m] != want:
                row[str(ids[m])] = {"logprob": -3.0, "rank": 2}
            if m in self.ties:
                row[str(V - 1)] = {"logprob": -0.10005, "rank": 2}
            if self.broken_rows == "vocab":
                row = {str(V + 5): {"logprob": -0.1, "rank": 1}, str(ids[m]): {"logprob": -3.0, "rank": 2}}
            rows.append([1, 2] if self.broken_rows == "list" else row)
        tops = [
            {"token_id": TEXT[len(ids)], "logprob": -0.1},
            {"token_id": V - 1, "logprob": -0.1 if self.bonus_tie else -4},
        ]
        choice = {
            "token_ids": [TEXT[len(ids)]],
            "logprobs": {"content": [{"token_id": TEXT[len(ids)], "top_logprobs": tops}]},
        }
        return httpx.Response(200, json={"choices": [choice], "prompt_logprobs": rows})

    def _lines(self, out: list[int]) -> Iterator[bytes]:
        for i, t in enumerate(out):
            if i and not self.flowing.wait(timeout=10):
                return
            yield f"data: {json.dumps({'choices': [{'token_ids': [t]}]})}\n\n".encode()
        yield b"data: [DONE]\n\n"


class _Tok:
    """The little of a tokenizer the target and the engine read (no text: ids only)."""

    vocab_size = V
    eos_ids: tuple[int, ...] = ()

    def decode(self, ids: list[int]) -> str:
        return ""


@pytest.fixture
def fake() -> FakeVllm:
    return FakeVllm()


@pytest.fixture
def target(fake: FakeVllm) -> VllmRoundTarget:
    client = httpx.Client(transport=httpx.MockTransport(fake))
    tok: TextTokenizer = _Tok()  # type: ignore[assignment]
    t = VllmRoundTarget(VllmWire("http://vllm", client, "m", timeout_s=5.0), tok, max_context=None)
    yield t
    fake.flowing.set()  # streams still open finish at once
    t.shutdown()


def _seq(params: SamplingParams = GREEDY) -> SequenceState:
    return SequenceState(
        list(PROMPT),
        params,
        PositionRandom(__import__("torch").Generator().manual_seed(1)),
        StopChecker(_Tok(), params),
    )  # type: ignore[arg-type]


def _opened(target: VllmRoundTarget, params: SamplingParams = GREEDY) -> SequenceState:
    s = _seq(params)
    r = Round(s, 16)
    target.open(r)
    assert r.error is None and r.emitted == TEXT[12:13]
    s.append(r.emitted)
    return s


def _round(target: VllmRoundTarget, s: SequenceState, draft: list[int]) -> Round:
    r = Round(s, 16, draft=Draft(draft, context=8))
    target.run([r])
    if r.error is None:
        r.kept = s.append(r.emitted)
    return r


def test_plain_rounds_follow_the_stream(target: VllmRoundTarget, fake: FakeVllm) -> None:
    fake.flowing.set()
    s = _opened(target)
    for _ in range(5):
        r = _round(target, s, [])
        assert r.error is None and r.accepted == 0 and len(r.emitted) == 1
    assert s.output == TEXT[12:18]
    assert fake.streams == 1 and fake.scores == 0  # one plain stream, no scoring request


def test_a_right_draft_is_scored_and_accepted_whole(target: VllmRoundTarget, fake: FakeVllm) -> None:
    s = _opened(target)
    r = _round(target, s, TEXT[13:17])
    assert r.error is None and not r.fallback and not r.declined
    assert r.accepted == 4 and r.emitted == TEXT[13:18]  # the four drafts and vLLM's bonus token
    assert fake.scores == 1
    fake.flowing.set()
    for _ in range(3):  # the stream went on from the round's end (or was reopened there)
        _round(target, s, [])
    assert s.output == TEXT[12:21]


@pytest.mark.parametrize("wrong_at", [0, 2])
def test_a_wrong_draft_is_cut_where_vllm_disagrees(target: VllmRoundTarget, wrong_at: int) -> None:
    s = _opened(target)
    draft = list(TEXT[13:17])
    draft[wrong_at] = 5  # outside the text's ids
    r = _round(target, s, draft)
    assert r.error is None and r.accepted == wrong_at
    assert r.emitted == TEXT[13 : 13 + wrong_at + 1]  # accepted drafts + vLLM's own token there
    assert s.output == TEXT[12 : 14 + wrong_at]


def test_a_failed_scoring_request_emits_the_streams_tokens(target: VllmRoundTarget, fake: FakeVllm) -> None:
    s = _opened(target)
    fake.fail_scores = True
    fake.flowing.set()  # the stream's next token is what the round emits
    r = _round(target, s, [5, 5, 5])  # wrong drafts: a round trusting them would emit a wrong token
    assert r.error is None and r.fallback and r.accepted == 0
    assert s.output == TEXT[12 : 12 + len(s.output)] and len(r.emitted) >= 1


def test_a_sampled_request_decodes_on_vllms_own_sampling(target: VllmRoundTarget, fake: FakeVllm) -> None:
    fake.flowing.set()
    s = _opened(target, SamplingParams(temperature=0.8, seed=3, max_new_tokens=40, ignore_eos=True))
    r = _round(target, s, TEXT[13:16])
    assert r.declined and r.target_decoded and r.drafted == 0 and fake.scores == 0


def test_a_failed_stream_fails_the_sequence_clearly(target: VllmRoundTarget, fake: FakeVllm) -> None:
    fake.fail_streams = True
    r = Round(_seq(), 16)
    target.open(r)
    assert r.error is not None and "vLLM" in r.error and "500" in r.error


def test_drafts_past_the_context_are_not_sent(fake: FakeVllm) -> None:
    client = httpx.Client(transport=httpx.MockTransport(fake))
    t = VllmRoundTarget(VllmWire("http://vllm", client, "m", 5.0), _Tok(), max_context=14)  # type: ignore[arg-type]
    try:
        s = _opened(t)
        r = _round(t, s, TEXT[13:17])  # history 13 + 4 drafts > 14: one draft fits
        assert r.error is None and r.accepted <= 1 and s.output[: len(r.emitted) + 1] == TEXT[12 : 13 + len(r.emitted)]
    finally:
        t.shutdown()


def test_the_engine_over_the_target_emits_vllms_text_with_lookup_drafts(
    target: VllmRoundTarget, fake: FakeVllm
) -> None:
    """The whole loop: a suffix drafter on a repetitive history, the target's pricer deciding which
    drafts are scored; the output is vLLM's text whatever was drafted."""
    from draftgate.drafters.suffix import SuffixDrafter

    fake.flowing.set()
    engine = Engine(target, SuffixDrafter(), k=None, k_max=8)
    done: list[int] = []
    finished: list[str] = []

    def sink(c) -> None:  # noqa: ANN001
        done.extend(c.token_ids)
        if c.finish_reason:
            finished.append(c.finish_reason)

    submit: Callable[..., object] = engine.submit
    try:
        submit(TEXT[:200], GREEDY, sink)
        import time

        deadline = time.monotonic() + 30
        while not finished and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.shutdown()
    assert finished == ["length"] and done == TEXT[200:240]


def test_a_near_tie_is_taken_from_the_stream_and_counted(target: VllmRoundTarget, fake: FakeVllm) -> None:
    """A row whose top two are closer than the margin is not trusted: vLLM's own decoding gives that position."""
    s = _opened(target)
    fake.ties = {14}  # the row that checks the second draft (TEXT[14])
    fake.flowing.set()
    r = _round(target, s, TEXT[13:17])
    assert r.error is None and s.output == TEXT[12 : 12 + len(s.output)]
    assert target.counts()["near_ties"] == 1


def test_a_near_tie_on_the_bonus_token_drops_the_bonus(target: VllmRoundTarget, fake: FakeVllm) -> None:
    s = _opened(target)
    fake.bonus_tie = True
    r = _round(target, s, TEXT[13:17])
    assert r.error is None and r.accepted == 4 and r.emitted == TEXT[13:17]  # the drafts, no bonus token
    assert target.counts()["near_ties"] == 1


@pytest.mark.parametrize("broken", ["list", "vocab"])
def test_any_exception_in_a_round_is_a_fallback_round_not_a_failed_batch(
    target: VllmRoundTarget, fake: FakeVllm, broken: str
) -> None:
    """Rows that are not dicts, or a top-1 outside the vocabulary: the round emits the stream's token; the
    other sequence of the same batch goes on."""
    a, b = _opened(target), _opened(target)
    fake.broken_rows = broken
    fake.flowing.set()
    ra, rb = Round(a, 16, draft=Draft(TEXT[13:17], context=8)), Round(b, 16)
    target.run([ra, rb])
    assert ra.error is None and ra.fallback and ra.emitted and ra.emitted == TEXT[13 : 13 + len(ra.emitted)]
    assert rb.error is None and rb.emitted == TEXT[13:14]


def test_every_wrong_token_a_lying_server_gets_out_is_counted(target: VllmRoundTarget, fake: FakeVllm) -> None:
    """A scoring answer that vouches for wrong drafts (a fault, as a proxy in front of vLLM injects) gets them
    emitted; each one is counted, as contradicted (the stream later sent otherwise) or as unconfirmed (no
    stream reached it), and logged when contradicted."""
    s = _opened(target)
    fake.lies = {14, 15}
    r = _round(target, s, [TEXT[13], 5, 6])  # two wrong drafts that the lie accepts
    assert r.error is None and r.emitted[:3] == [TEXT[13], 5, 6]
    fake.flowing.set()
    for _ in range(4):
        assert _round(target, s, []).error is None
    wrong = sum(a != b for a, b in zip(s.output, TEXT[12:], strict=False))
    c = target.counts()
    assert wrong >= 2 and c["contradicted"] + c["unconfirmed"] >= 2


def test_a_contradiction_by_the_stream_is_counted_and_logged(
    target: VllmRoundTarget, fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the stream is kept (opening a new one costs more than waiting), it later sends vLLM's own
    tokens where the lie put others: counted as contradicted, logged, and the sequence goes on."""
    s = _opened(target)
    target.pricer.observe_gap(0.001)  # a plain token costs 1 ms, a new stream 1 s: the round keeps the stream
    target.pricer.observe_open(1.0)
    fake.lies = {14}
    r = _round(target, s, [TEXT[13], 5])
    assert r.emitted[:2] == [TEXT[13], 5]
    fake.flowing.set()
    with caplog.at_level("WARNING", logger="draftgate.vllm_rounds"):
        assert _round(target, s, []).error is None
    assert target.counts()["contradicted"] >= 1
    assert any("contradicts" in m for m in caplog.messages)
