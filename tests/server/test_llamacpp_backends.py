"""llama.cpp server back ends: the llamacpp+http drafter and the openai+http target.

The refusal test needs no llama.cpp (sampling is refused at submit time). The
others start a real llama-cpp-python server subprocess on the bundled GGUF
(``--logits_all true``: prompt log-probabilities need every position's logits).
"""

from __future__ import annotations

import importlib.util
import os
import queue
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from gateway_support import CLIENT_KEY, serve_app

from draftgate.drafters import NgramDrafter
from draftgate.drafters.llamacpp_server import LlamaCppServerDrafter
from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.models.loader import LoadedModel, resolve_model_path
from draftgate.server import AuthConfig, Route, RouteTable, create_app
from draftgate.server.targets import DrafterSpec, RemoteDrafterKind, TargetKind, TargetSpec
from draftgate.server.targets.build import build_backend
from draftgate.server.targets.openai_engine import OpenAITargetEngine
from draftgate.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16, ignore_eos=True)
PROMPTS = ["The capital of France is", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]
needs_llama = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed")


# ------------------------------------------------------------------ no llama.cpp needed


def test_sampling_is_refused_without_allow_approximate(tiny_model: LoadedModel) -> None:
    """A 400 at request validation: no server is contacted (the URL points nowhere)."""
    eng = OpenAITargetEngine("http://127.0.0.1:9", tiny_model.tokenizer, NgramDrafter(), k=4)
    routes = RouteTable.of([Route("remote", eng, model="tiny")])
    try:
        with serve_app(create_app(routes, AuthConfig(api_keys=frozenset({CLIENT_KEY})))) as url:
            h = {"Authorization": f"Bearer {CLIENT_KEY}"}
            r = httpx.post(
                url + "/v1/completions", headers=h, json={"model": "remote", "prompt": "hi", "temperature": 0.7}
            )
            assert r.status_code == 400, r.text
            assert "exact only for greedy" in r.json()["error"]["message"]
            assert eng.rounds == 0 and eng.num_running == 0 and eng.num_waiting == 0
    finally:
        routes.close()
    approx = OpenAITargetEngine("http://127.0.0.1:9", tiny_model.tokenizer, None, allow_approximate=True)
    approx.check_params(SamplingParams(temperature=0.7))  # allowed (and reported) when the route says so


def test_llamacpp_drafter_failure_means_no_drafts(tiny_model: LoadedModel) -> None:
    from draftgate.drafters.base import DraftRequest

    d = LlamaCppServerDrafter("http://127.0.0.1:9", tiny_model.tokenizer, timeout_s=0.05)
    (out,) = d.propose([DraftRequest(1, (5, 6, 7), 4, GREEDY)])
    assert out.token_ids == [] and d.failures == 1
    d.close()


# ------------------------------------------------------------------ a real llama.cpp server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    port = _free_port()
    gguf = str(resolve_model_path("smollm2-135m"))
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        "2",
        "--logits_all",
        "true",
        "--n_ctx",
        "2048",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the llama.cpp server did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _run(engine: object, ids: list[int], params: SamplingParams) -> tuple[list[int], object]:
    q: queue.SimpleQueue = queue.SimpleQueue()
    engine.submit(ids, params, q.put)  # type: ignore[attr-defined]
    toks: list[int] = []
    while True:
        c = q.get(timeout=120)
        toks.extend(c.token_ids)
        if c.finish_reason is not None:
            assert c.finish_reason in ("stop", "length"), c.error
            return toks, c.stats


@pytest.mark.slow
@pytest.mark.real_model
@needs_llama
def test_llamacpp_drafter_in_front_of_embedded_is_lossless(real_model: LoadedModel, llama_server: str) -> None:
    cfg = EngineConfig(model="smollm2-135m", drafter=DrafterKind.NONE, k=4, num_blocks=256, block_size=16)
    plain = build_engine(cfg, loaded=real_model)
    spec = build_backend(
        cfg, TargetSpec(TargetKind.EMBEDDED), DrafterSpec(RemoteDrafterKind.LLAMACPP, llama_server, 5.0), real_model
    )
    try:
        drafted = 0
        for p in PROMPTS:
            ids = real_model.tokenizer.encode(p)
            want, _ = _run(plain, ids, GREEDY)
            got, stats = _run(spec, ids, GREEDY)
            assert got == want
            drafted += stats.draft_tokens  # type: ignore[attr-defined]
        d = spec.drafter  # a timed-out round (a loaded machine) only costs drafts: not every round may fail
        assert drafted > 0 and d.failures < d.rounds  # type: ignore[attr-defined]
    finally:
        plain.shutdown()
        spec.shutdown()
        spec.drafter.close()  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.real_model
@needs_llama
@pytest.mark.xfail(
    reason="llama-cpp-python's server takes text prompts only: the server's own greedy token sequence is often "
    "not the canonical tokenization of its text, so a history re-sent as text diverges from the server's own "
    "state (detected as a re-tokenization error) or, with equal tokenizations, batched vs sequential Q4 "
    "evaluation picks a different argmax; see draftgate.server.targets.openai_target",
    strict=False,
)
def test_gateway_over_llamacpp_target_matches_server_greedy(real_model: LoadedModel, llama_server: str) -> None:
    eng = OpenAITargetEngine(llama_server, real_model.tokenizer, NgramDrafter(), k=4)
    try:
        for p in PROMPTS:
            got, _ = _run(
                eng, real_model.tokenizer.encode(p), SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
            )
            r = httpx.post(
                llama_server + "/v1/completions", json={"prompt": p, "max_tokens": 8, "temperature": 0}, timeout=60
            )
            assert real_model.tokenizer.decode(got) == r.json()["choices"][0]["text"]
    finally:
        eng.shutdown()
