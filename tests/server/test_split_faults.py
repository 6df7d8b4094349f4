"""Fault tests of the split deployment through the gateway (a failed target or drafter frees
everything and is a clear error).

Every server is real and on loopback: the gateway (uvicorn), gRPC target workers
(in-process, or a ``draftgate serve-target`` subprocess where the test kills it),
HTTP draft workers (a ``draftgate serve-draft`` subprocess where the test kills
it, in-process where it must answer slowly). For each fault: the outcome the
design requires, then KV blocks and sessions back to their baseline on the
gateway, the target worker and the draft worker.

    draft worker killed mid-stream   -> the request finishes plainly, text == plain greedy
    draft worker slow past timeout   -> the same
    target worker killed mid-stream  -> an error event in the stream; new requests go to a live worker
    client disconnect mid-stream     -> the session is closed, its KV freed, the draft session deleted

(The embedded engine's disconnect and error paths are in test_server_failures.py.)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from gateway_support import CLIENT_KEY, WAIT_S, Gateway, metric, serve_app

from draftgate.drafters import NgramDrafter
from draftgate.drafters.base import Draft, DraftRequest
from draftgate.drafters.http import HttpDrafter
from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.engine.session_host import SessionHost
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.server import AuthConfig, Route, RouteTable, create_app
from draftgate.server.targets.grpc_engine import RemoteTargetEngine
from draftgate.server.workers.draft_worker import DraftService, create_draft_app
from draftgate.server.workers.target_server import TargetWorkerServer
from draftgate.types import SamplingParams

PROMPT = "a b c a b c a b c a b"  # n-gram lookups find drafts from the first round on
MAX_TOKENS = 120
STREAM = {
    "model": "split",
    "prompt": PROMPT,
    "max_tokens": MAX_TOKENS,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}
FORWARD_DELAY_S = 0.02  # per target forward: a request is surely still running when the test acts


# ------------------------------------------------------------------ helpers


def wait_for(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def events(r: httpx.Response) -> Iterator[dict]:
    """The SSE stream's data events (keep the iterator alive while the stream should live)."""
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def read_text(stream: Iterator[dict], first: Sequence[dict] = ()) -> tuple[str, dict]:
    """All text of a completions stream and its last event carrying a finish reason."""
    text, last = "", {}
    for ev in [*first, *stream]:
        assert "error" not in ev, ev
        for c in ev.get("choices", []):
            text += c.get("text") or ""
            if c.get("finish_reason"):
                last = ev
    return text, last


class Worker:
    """An in-process gRPC target worker on the tiny model whose forward can be slowed down."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.server = TargetWorkerServer(SessionHost(ModelRunner(loaded, num_blocks=256, block_size=8), "tiny")).start()
        runner = self.server.host.runner
        real = runner.forward_flat

        def forward(items):  # type: ignore[no-untyped-def]
            time.sleep(FORWARD_DELAY_S)
            return real(items)

        runner.forward_flat = forward  # type: ignore[method-assign]

    @property
    def address(self) -> str:
        return self.server.target

    def assert_baseline(self) -> None:
        wait_for(lambda: self.server.host.open_sessions == 0, "the target worker to close its sessions")
        self.server.host.runner.kv.check_no_leaks()


class Proc:
    """A ``draftgate`` worker command in its own process (so it can be killed for real)."""

    def __init__(self, args: list[str], log: Path) -> None:
        cmd = [sys.executable, "-c", "from draftgate.cli.main import entry; entry()", *args, "--log-level", "warning"]
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err, env={**os.environ})

    def check_alive(self) -> None:
        assert self.proc.poll() is None, f"the worker exited early: {self.log.read_text()[-2000:]}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._err.close()


def draft_sessions(url: str) -> int:
    return int(httpx.get(url + "/health", timeout=5).json()["sessions"])


@pytest.fixture(scope="module")
def plain_text(tiny_model: LoadedModel) -> str:
    """Plain greedy decoding of PROMPT on the embedded engine: what every split request must produce."""
    cfg = EngineConfig(model="tiny", drafter=DrafterKind.NONE, num_blocks=256, block_size=8)
    engine: Engine = build_engine(cfg, loaded=tiny_model)
    try:
        return engine.complete(PROMPT, SamplingParams(max_new_tokens=MAX_TOKENS, ignore_eos=True), raw=True).text
    finally:
        engine.shutdown()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Callable[[list[str]], Proc]]:
    made: list[Proc] = []

    def start(args: list[str]) -> Proc:
        p = Proc(args, tmp_path / f"worker-{len(made)}.log")
        made.append(p)
        return p

    yield start
    for p in made:
        p.stop()


@pytest.fixture
def workers(tiny_model: LoadedModel) -> Iterator[Callable[[], Worker]]:
    made: list[Worker] = []

    def start() -> Worker:
        w = Worker(tiny_model)
        made.append(w)
        return w

    yield start
    for w in made:
        w.server.stop(grace=0)
        w.server.host.runner.kv.check_no_leaks()


@contextmanager
def split_gateway(engine: RemoteTargetEngine) -> Iterator[Gateway]:
    """The gateway with one route, ``split``, served by ``engine``; checks the route's baseline at exit."""
    routes = RouteTable.of([Route("split", engine, model="tiny")])
    app = create_app(routes, AuthConfig(api_keys=frozenset({CLIENT_KEY})))
    try:
        with serve_app(app) as url:
            yield Gateway(url, routes, app)
            wait_for(lambda: engine.num_running == 0 and engine.num_waiting == 0, "the route to be idle")
            assert all(w.sessions == 0 for w in engine.pool.workers), "the gateway still counts sessions"
    finally:
        routes.close()


# ------------------------------------------------------------------ draft tier faults


def test_draft_worker_killed_mid_stream_finishes_plainly(tiny_model, workers, procs, plain_text) -> None:  # type: ignore[no-untyped-def]
    target = workers()
    port = free_port()
    draft = procs(["serve-draft", "--drafter", "ngram", "--host", "127.0.0.1", "--port", str(port)])
    draft_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:  # the worker process is up
        draft.check_alive()
        try:
            if httpx.get(draft_url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the draft worker never answered /health"
            time.sleep(0.1)
    # A generous timeout: the healthy worker's answers count even on a loaded machine.
    drafter = HttpDrafter(draft_url, timeout_s=5.0)
    remote = RemoteTargetEngine([target.address], tiny_model.tokenizer, drafter, k=4)
    try:
        with split_gateway(remote) as gw, gw.http() as http, http.stream("POST", "/v1/completions", json=STREAM) as r:
            assert r.status_code == 200
            stream = events(r)
            first = [next(stream)]
            # The tiny model's output turns periodic after a few tokens: then the lookups find drafts.
            wait_for(lambda: remote.stats.draft_tokens > 0, "the first drafts")  # the draft tier is in use
            assert draft_sessions(draft_url) == 1
            draft.kill()
            assert remote.num_running == 1  # killed while the request was in flight
            text, last = read_text(stream, first)
        assert last["choices"][0]["finish_reason"] == "length"
        assert text == plain_text  # no token lost or repeated
        assert last["speculative"]["draft_tokens"] > 0  # drafts before the kill, plain decoding after
        target.assert_baseline()
    finally:
        drafter.close()


class SlowAfter(NgramDrafter):
    """n-gram drafts; once ``fast_drafts`` of them carried tokens, every answer takes ``pause_s``."""

    def __init__(self, fast_drafts: int, pause_s: float) -> None:
        super().__init__()
        self.fast_drafts = fast_drafts
        self.pause_s = pause_s
        self.drafted = 0  # drafts with tokens
        self.slow_calls = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        if self.drafted >= self.fast_drafts:
            self.slow_calls += 1
            time.sleep(self.pause_s)
        out = super().propose(requests)
        self.drafted += sum(bool(d.token_ids) for d in out)
        return out


def test_draft_worker_slow_past_its_timeout_finishes_plainly(tiny_model, workers, plain_text) -> None:  # type: ignore[no-untyped-def]
    target = workers()
    slow = SlowAfter(fast_drafts=2, pause_s=3.0)
    service = DraftService(slow)
    with serve_app(create_draft_app(service)) as draft_url:
        drafter = HttpDrafter(draft_url, timeout_s=1.0)  # a slow answer takes 3 s: past it
        remote = RemoteTargetEngine([target.address], tiny_model.tokenizer, drafter, k=4)
        try:
            with (
                split_gateway(remote) as gw,
                gw.http() as http,
                http.stream("POST", "/v1/completions", json=STREAM) as r,
            ):
                assert r.status_code == 200
                text, last = read_text(events(r))
            assert last["choices"][0]["finish_reason"] == "length"
            assert text == plain_text
            assert last["speculative"]["draft_tokens"] > 0  # drafts before the worker went slow
            assert slow.slow_calls == 1  # the timed-out worker was not asked again for this request
            target.assert_baseline()
            # The worker finishes its late answer, then honours the request's DELETE: no session is left.
            wait_for(lambda: service.num_sessions == 0, "the draft worker to drop the session")
        finally:
            drafter.close()


# ------------------------------------------------------------------ target tier fault


class PausedNgram(NgramDrafter):
    """n-gram drafts after a short pause: keeps a request in flight while its worker is killed."""

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        time.sleep(FORWARD_DELAY_S)
        return super().propose(requests)


def test_target_worker_killed_mid_stream_is_an_error_event(
    tiny_model, tiny_model_dir, workers, procs, plain_text
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    victim = procs(
        [
            "serve-target",
            "--model",
            str(tiny_model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--kv-blocks",
            "256",
            "--block-size",
            "8",
            "--threads",
            "1",
        ]
    )
    address = f"127.0.0.1:{port}"
    with grpc.insecure_channel(address) as ch:
        deadline = time.monotonic() + 120
        while True:
            victim.check_alive()
            try:
                grpc.channel_ready_future(ch).result(timeout=1)
                break
            except grpc.FutureTimeoutError:
                assert time.monotonic() < deadline, "the target worker never came up"
    live = workers()
    # The victim is listed first: on a tie the least-loaded choice takes it for the first session.
    remote = RemoteTargetEngine([address, live.address], tiny_model.tokenizer, PausedNgram(), k=4, retry_s=60.0)
    with split_gateway(remote) as gw, gw.openai() as oai:
        stream = oai.completions.create(
            model="split",
            prompt=PROMPT,
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        n = 0
        with pytest.raises(openai.APIError, match="target worker"):
            for _ in stream:
                n += 1
                if n == 2:
                    assert live.server.host.open_sessions == 0  # the session is on the victim
                    victim.kill()
        wait_for(lambda: remote.num_running == 0, "the failed request to end")
        assert [w.down for w in remote.pool.workers] == [True, False]
        # New requests go to the live worker, exactly as plain decoding.
        with gw.http() as http:
            r = http.post("/v1/completions", json={**STREAM, "stream": False})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == plain_text
    live.assert_baseline()


# ------------------------------------------------------------------ client fault


def test_client_disconnect_mid_stream_frees_the_session_everywhere(tiny_model, workers) -> None:  # type: ignore[no-untyped-def]
    target = workers()
    service = DraftService(NgramDrafter())
    with serve_app(create_draft_app(service)) as draft_url:
        drafter = HttpDrafter(draft_url, timeout_s=5.0)
        remote = RemoteTargetEngine([target.address], tiny_model.tokenizer, drafter, k=4)
        try:
            with split_gateway(remote) as gw, gw.http() as http:
                aborts = metric(gw, "draftgate:request_failure_total", model_name="split", reason="abort")
                with http.stream("POST", "/v1/completions", json={**STREAM, "max_tokens": 200}) as r:
                    assert r.status_code == 200
                    stream = events(r)
                    next(stream)
                    wait_for(
                        lambda: service.num_sessions == 1 and target.server.host.open_sessions == 1, "the sessions"
                    )
                    assert remote.num_running == 1
                # The client is gone: the gateway cancels, the target session closes, the draft session goes.
                wait_for(lambda: remote.num_running == 0, "the gateway to drop the request")
                target.assert_baseline()
                wait_for(lambda: service.num_sessions == 0, "the draft worker to drop the session")
                wait_for(
                    lambda: (
                        metric(gw, "draftgate:request_failure_total", model_name="split", reason="abort") == aborts + 1
                    ),
                    "the abort to be counted",
                )
                r2 = http.post("/v1/completions", json={**STREAM, "stream": False, "max_tokens": 3})
                assert r2.status_code == 200, r2.text
            target.assert_baseline()
        finally:
            drafter.close()
