"""HTTP draft worker (`draftgate serve-draft`) and HttpDrafter: exact sparse q, sessions, failures.

The draft model here is the tiny model itself, so its greedy drafts are the
target's own choices (every draft accepted): a wrong offset or a stale session
would show up as lost acceptance or, worse, as a changed output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import httpx
import pytest
from gateway_support import serve_app

from draftgate.drafters import NgramDrafter
from draftgate.drafters.http import HttpDrafter
from draftgate.drafters.model import ModelDrafter
from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.engine.session_host import SessionHost
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.server.targets.grpc_engine import RemoteTargetEngine
from draftgate.server.workers.draft_worker import DraftService, create_draft_app
from draftgate.server.workers.target_server import TargetWorkerServer
from draftgate.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)
HISTORY = [1, 7, 9, 11, 13, 5, 8, 21, 30, 4, 9, 11]


@pytest.fixture(scope="module")
def model_service(tiny_model: LoadedModel) -> DraftService:
    runner = ModelRunner(tiny_model, num_blocks=128, block_size=8)
    return DraftService(ModelDrafter(runner, q_top_n=16), max_sessions=8, vocab_size=runner.vocab_size)


@pytest.fixture(scope="module")
def draft_url(model_service: DraftService) -> Iterator[str]:
    with serve_app(create_draft_app(model_service)) as url:
        yield url


@pytest.fixture(scope="module")
def plain(tiny_model: LoadedModel) -> Iterator[Engine]:
    cfg = EngineConfig(model="tiny", drafter=DrafterKind.NONE, num_blocks=256, block_size=8)
    engine = build_engine(cfg, loaded=tiny_model)
    yield engine
    engine.shutdown()


@pytest.fixture
def remote_with(tiny_model: LoadedModel) -> Iterator[Callable[..., RemoteTargetEngine]]:
    """A RemoteTargetEngine on a fresh target worker; leak-checked at teardown."""
    made: list[tuple[RemoteTargetEngine, TargetWorkerServer]] = []

    def make(drafter: HttpDrafter, **kw: object) -> RemoteTargetEngine:
        worker = TargetWorkerServer(SessionHost(ModelRunner(tiny_model, num_blocks=256, block_size=8))).start()
        eng = RemoteTargetEngine([worker.target], tiny_model.tokenizer, drafter, **kw)  # type: ignore[arg-type]
        made.append((eng, worker))
        return eng

    yield make
    for eng, worker in made:
        eng.shutdown()
        worker.stop(grace=0)
        worker.host.runner.kv.check_no_leaks()


def propose(url: str, **body: object) -> httpx.Response:
    return httpx.post(url + "/v1/propose", json=body, timeout=10.0)


# ------------------------------------------------------------------ the endpoint


def test_sampled_q_is_a_distribution_containing_each_token(draft_url: str) -> None:
    r = propose(draft_url, tokens=HISTORY, num_tokens=5, temperature=1.0, top_k=10, seed=3)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["tokens"]) == len(body["q"]) == len(body["logprobs"]) == 5
    for t, row, lp in zip(body["tokens"], body["q"], body["logprobs"], strict=True):
        assert 1 <= len(row["ids"]) <= 10 and len(set(row["ids"])) == len(row["ids"])  # top_k, then top-16
        assert math.fsum(row["probs"]) == pytest.approx(1.0, abs=1e-5)
        assert all(p > 0 for p in row["probs"])
        assert t in row["ids"]
        assert lp == pytest.approx(math.log(row["probs"][row["ids"].index(t)]), abs=1e-6)
    again = propose(draft_url, tokens=HISTORY, num_tokens=5, temperature=1.0, top_k=10, seed=3).json()
    assert again["tokens"] == body["tokens"]  # seeded: reproducible


def test_greedy_rows_are_one_hot_at_the_models_choice(tiny_model: LoadedModel, plain: Engine, draft_url: str) -> None:
    body = propose(draft_url, tokens=HISTORY, num_tokens=6).json()
    assert [row["probs"] for row in body["q"]] == [[1.0]] * 6
    assert [row["ids"] for row in body["q"]] == [[t] for t in body["tokens"]]
    want = plain.complete(HISTORY, SamplingParams(max_new_tokens=6, ignore_eos=True)).token_ids
    assert body["tokens"] == want  # the draft model is the target: its greedy drafts are the target's


def test_session_form_sends_only_new_tokens(draft_url: str, model_service: DraftService) -> None:
    full = propose(draft_url, tokens=HISTORY, num_tokens=4).json()
    first = propose(draft_url, session_id="s1", tokens=HISTORY[:7], num_tokens=4).json()
    assert first["history_len"] == 7
    second = propose(draft_url, session_id="s1", offset=7, tokens=HISTORY[7:], num_tokens=4).json()
    assert second["history_len"] == len(HISTORY) and second["tokens"] == full["tokens"]
    # Rewriting the tail (offset inside the history) replaces it.
    third = propose(draft_url, session_id="s1", offset=5, tokens=HISTORY[5:], num_tokens=4).json()
    assert third["tokens"] == full["tokens"]
    r = propose(draft_url, session_id="s1", offset=99, tokens=[3], num_tokens=4)
    assert r.status_code == 409
    assert propose(draft_url, session_id="unknown", offset=3, tokens=[3]).status_code == 409
    assert httpx.delete(draft_url + "/v1/sessions/s1").json() == {"deleted": True}
    assert httpx.delete(draft_url + "/v1/sessions/s1").json() == {"deleted": False}


def test_bad_input_is_400(draft_url: str) -> None:
    assert propose(draft_url, tokens=[1, 10_000], num_tokens=2).status_code == 400
    assert propose(draft_url, tokens=[], num_tokens=2).status_code == 400
    assert propose(draft_url, tokens=[1, 2], num_tokens=1000).status_code == 422
    assert propose(draft_url, tokens=[1, 2], temperature=-1).status_code == 422


def test_ngram_mode_has_one_hot_q() -> None:
    service = DraftService(NgramDrafter())
    with serve_app(create_draft_app(service)) as url:
        body = propose(url, tokens=[5, 6, 7, 8, 5, 6], num_tokens=3, temperature=0.8).json()
    assert body["tokens"] == [7, 8, 5]
    assert body["q"] == [{"ids": [t], "probs": [1.0]} for t in body["tokens"]]
    assert body["logprobs"] == [0.0, 0.0, 0.0]


# ------------------------------------------------------------------ HttpDrafter in a split deployment


def test_http_drafter_greedy_is_lossless_and_accepts(draft_url: str, plain: Engine, remote_with) -> None:  # type: ignore[no-untyped-def]
    drafter = HttpDrafter(draft_url, timeout_s=5.0)
    remote = remote_with(drafter, k=4)
    for prompt in ["hello world the", "the world is an of"]:
        got = remote.complete(prompt, GREEDY)
        assert got.token_ids == plain.complete(prompt, GREEDY).token_ids
        assert got.stats.acceptance_rate == 1.0  # same model on both ends, in sync through the sessions
    drafter.close()


def test_http_drafter_sampled_drafts_run_exact_verification(draft_url: str, remote_with) -> None:  # type: ignore[no-untyped-def]
    drafter = HttpDrafter(draft_url, timeout_s=5.0)
    remote = remote_with(drafter, k=3)
    params = SamplingParams(temperature=0.8, top_k=20, seed=11, max_new_tokens=30, ignore_eos=True)
    a = remote.complete("hello world", params)
    assert len(a.token_ids) == 30 and a.stats.draft_tokens > 0
    # q = the target's own (truncated) distribution: most drafts are accepted.
    assert a.stats.acceptance_rate > 0.5
    assert remote.wire.max_round_bytes > 100  # sparse q rows went to the target
    drafter.close()


def test_http_drafter_against_a_stopped_worker_decodes_plainly(plain: Engine, remote_with) -> None:  # type: ignore[no-untyped-def]
    with serve_app(create_draft_app(DraftService(NgramDrafter()))) as url:
        pass  # started and stopped: nothing listens there now
    drafter = HttpDrafter(url)  # default 50 ms timeout
    remote = remote_with(drafter, k=4)
    for prompt in ["hello world the", "a b c a b c a b"]:
        got = remote.complete(prompt, GREEDY)
        assert got.token_ids == plain.complete(prompt, GREEDY).token_ids
        assert got.stats.draft_tokens == 0 and got.finish_reason == "length"
    drafter.close()
