"""`check-lossless` over the split deployment: a gRPC target worker and an HTTP draft worker on loopback.

The draft worker serves a sampled model draft (sparse q) or an n-gram drafter; the target
worker verifies. Every check must pass, and each worker must end with no session and no KV
block held. (openai+http is checked in test_openai_target_mock.py; the embedded engine and the
planted broken verifiers in tests/bench/test_check_lossless.py.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from gateway_support import serve_app

from draftgate.bench.check_lossless import CheckConfig, CheckPrompt, check_lossless, render
from draftgate.drafters import NgramDrafter
from draftgate.drafters.http import HttpDrafter
from draftgate.drafters.model import ModelDrafter
from draftgate.engine.session_host import SessionHost
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.server.targets.grpc_engine import RemoteTargetEngine
from draftgate.server.workers.draft_worker import DraftService, create_draft_app
from draftgate.server.workers.target_server import TargetWorkerServer

PROMPTS = ["a b c a b c a b", "hello world the hello world"]


@pytest.fixture(scope="module")
def target_worker(tiny_model: LoadedModel) -> Iterator[TargetWorkerServer]:
    worker = TargetWorkerServer(SessionHost(ModelRunner(tiny_model, num_blocks=512, block_size=8), "tiny")).start()
    yield worker
    worker.stop(grace=0)


@pytest.mark.parametrize(("draft", "k"), [("model", 4), ("model", None), ("ngram", None)])
def test_check_lossless_over_grpc_and_an_http_draft_worker(
    tiny_model: LoadedModel, tiny_draft: LoadedModel, target_worker: TargetWorkerServer, draft: str, k: int | None
) -> None:
    if draft == "model":
        drafter = ModelDrafter(ModelRunner(tiny_draft, num_blocks=256, block_size=8), q_top_n=24)
    else:
        drafter = NgramDrafter()
    service = DraftService(drafter, max_sessions=16, vocab_size=tiny_model.config.vocab_size)
    with serve_app(create_draft_app(service)) as url:
        engine = RemoteTargetEngine([target_worker.target], tiny_model.tokenizer, HttpDrafter(url, timeout_s=5.0), k=k)
        try:
            cases = [
                CheckPrompt(str(i), tiny_model.tokenizer.encode(p, add_special=False)) for i, p in enumerate(PROMPTS)
            ]
            cfg = CheckConfig(
                max_new_tokens=20, seeds=(5, 6), samples=80, sample_tokens=3, ignore_eos=True, concurrency=4
            )
            report = check_lossless(engine, f"grpc + http {draft}", cases, cfg)
            assert report.passed, render(report)
            assert {f.check for f in report.findings} == {"greedy", "seeded", "distribution"}
            assert engine.stats.draft_tokens > 0  # the draft worker did propose
        finally:
            engine.shutdown()
    deadline = time.monotonic() + 10
    while target_worker.host.open_sessions:
        assert time.monotonic() < deadline, "the target worker kept sessions open"
        time.sleep(0.01)
    target_worker.host.runner.kv.check_no_leaks()


def test_the_gateways_lossless_canary_checks_a_grpc_route(
    tiny_model: LoadedModel, target_worker: TargetWorkerServer
) -> None:
    """The canary re-runs greedy speculative requests plainly on the same back end: on a gRPC
    route it used to do nothing (rerun_plain returned None) while the admin API took a fraction."""
    import httpx
    from gateway_support import ADMIN_KEY, CLIENT_KEY
    from ops_support import ADMIN, PROMPT

    from draftgate.server import AuthConfig, Route, RouteTable, create_app
    from draftgate.server.ops import OpsConfig

    engine = RemoteTargetEngine([target_worker.target], tiny_model.tokenizer, NgramDrafter(), k=4)
    routes = RouteTable.of([Route("grpc", engine, model="tiny")])
    auth = AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    app = create_app(routes, auth, OpsConfig(seed=0, background_cpu_share=1.0))
    try:
        with serve_app(app) as url:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60) as admin:
                assert admin.post(ADMIN + "/grpc", json={"lossless_fraction": 1.0}).status_code == 200
            body = {"model": "grpc", "prompt": PROMPT, "max_tokens": 30, "temperature": 0, "ignore_eos": True}
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=60) as c:
                outs = [c.post("/v1/completions", json=body).json() for _ in range(3)]
            drafted = sum(o["speculative"]["draft_tokens"] > 0 for o in outs)
            ops = app.state.ops
            assert drafted >= 1 and ops.lossless_worker.wait_idle(60)
            assert ops["grpc"].lossless_checks == drafted and ops["grpc"].lossless_mismatches == 0
    finally:
        routes.close()
