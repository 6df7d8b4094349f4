"""The vLLM tests: the proposer's logic without vLLM, and live servers shared by the session.

The live fixtures start vLLM (the CPU build in its own virtualenv, installed once by
``scripts/vllm_env.sh``, cached by its pinned requirements) only when a live test asks for them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# serve_app (a real uvicorn server on loopback) lives with the server tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "server"))

from vllm_support import ROOT, Spec, Worker  # noqa: E402

from draftgate.integrations.vllm.tools.launch import (  # noqa: E402
    VllmEnv,
    VllmLaunch,
    draftgate_spec,
    free_port,
    vllm_env,
    vllm_server,
)


@pytest.fixture(scope="session")
def env() -> VllmEnv:
    return vllm_env(ROOT / "scripts" / "vllm_env.sh")


@pytest.fixture(scope="session")
def worker() -> Iterator[Worker]:
    w = Worker()
    w.start()
    yield w
    w.stop()


@pytest.fixture(scope="session")
def plain(env: VllmEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # The reference (vLLM's own decoding) and, with its token route on, the gateway rounds' target.
    with vllm_server(VllmLaunch(env, scale_out=True, log=tmp_path_factory.mktemp("vllm") / "plain.log")) as url:
        yield url


@pytest.fixture(scope="session")
def spec(env: VllmEnv, worker: Worker, plain: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spec]:
    log = tmp_path_factory.mktemp("vllm") / "spec.log"
    port = free_port()
    extra = {
        "DRAFTGATE_VLLM_DRAFT_URL": worker.url,
        "DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS": "200",  # generous: the worker shares two cores with two vLLMs
        "DRAFTGATE_VLLM_CONTROL_PORT": str(port),
    }
    with vllm_server(VllmLaunch(env, speculative=draftgate_spec(8), extra_env=extra, log=log)) as url:
        yield Spec(url, f"http://127.0.0.1:{port}", log)
