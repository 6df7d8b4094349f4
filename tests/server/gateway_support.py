"""Support for the gateway tests: a real uvicorn server on loopback, tiny-model engines, leak checks.

Routes of the shared gateway (one engine each, all on the tiny model's weights):
    tiny        drafter auto (the default route shape)
    tiny-ngram  n-gram drafter, K = 4 (drafts on every round it finds a match)
    tiny-plain  no drafter (the reference for lossless checks)
    tiny-tight  no drafter, one running and one waiting request at most (429 tests)
    tiny-broken no drafter; tests break its runner to see engine errors
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.models.loader import LoadedModel
from draftgate.server import RouteTable

CLIENT_KEY = "sk-client-0123456789"
ADMIN_KEY = "sk-admin-0123456789"
WAIT_S = 30.0


@contextmanager
def serve_app(app: FastAPI, port: int = 0) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread on loopback (``port``, 0: a free one); yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and thread.is_alive(), "the server never answered /health"
            time.sleep(0.02)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=WAIT_S)
        sock.close()


def tiny_engine(loaded: LoadedModel, drafter: DrafterKind, k: int | None = None, **kw: object) -> Engine:
    kw.setdefault("num_blocks", 256)
    kw.setdefault("block_size", 8)
    cfg = EngineConfig(model="tiny", drafter=drafter, k=k, **kw)  # type: ignore[arg-type]
    return build_engine(cfg, loaded=loaded)


def wait_idle(engine: Engine, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while engine.num_running or engine.num_waiting:
        assert time.monotonic() < deadline, "the engine never became idle"
        time.sleep(0.01)


def assert_no_leaks(engine: Engine) -> None:
    wait_idle(engine)
    engine.runner.kv.check_no_leaks()
    assert engine.target.reserved_blocks == 0, f"engine still reserves {engine.target.reserved_blocks} blocks"


def metric(gateway: Gateway, name: str, **labels: str) -> float:
    """One sample from /metrics (0.0 when the labelled series does not exist yet)."""
    text = httpx.get(gateway.url + "/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@dataclass
class Gateway:
    url: str
    routes: RouteTable
    app: FastAPI

    def engine(self, name: str) -> Engine:
        route = self.routes.get(name)
        assert route is not None
        return route.engine  # type: ignore[return-value]

    def http(self, key: str | None = CLIENT_KEY, timeout: float = WAIT_S) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def openai(self, key: str = CLIENT_KEY):  # -> openai.OpenAI
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=WAIT_S)

    def all_idle_no_leaks(self) -> None:
        for r in self.routes:
            assert_no_leaks(r.engine)  # type: ignore[arg-type]
