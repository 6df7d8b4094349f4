"""The processes a vLLM comparison runs (``integrations.vllm.tools.compare``): vLLM servers per arm, a
DraftGate gateway in front of one, a draft worker for the remote arm; each started on loopback and
stopped with the comparison."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from draftgate.bench.delay_proxy import DelayProxy
from draftgate.integrations.vllm.tools.launch import (
    SERVED_NAME,
    VllmEnv,
    VllmLaunch,
    draftgate_spec,
    free_port,
    vllm_server,
)

__all__ = ["Arm", "RemoteTier", "start_servers"]


@dataclass(frozen=True)
class Arm:
    name: str
    server: str  # "plain" | "ngram" | "draftgate": which vLLM process serves it
    xargs: Mapping[str, Any] = field(default_factory=dict)
    what: str = ""
    gateway: str | None = None  # a DraftGate gateway with this drafter in front of the server (its own rounds)


@contextmanager
def _gateway(target: str, drafter: str, port: int) -> Iterator[str]:
    """`draftgate serve` in its own process: one route named as vLLM's model, its target the vLLM server."""
    cmd = [
        sys.executable,
        "-m",
        "draftgate",
        "serve",
        "--target",
        f"vllm+{target}",
        "--drafter",
        drafter,
        "--served-model-name",
        SERVED_NAME,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    with _process(cmd, port, "the gateway") as url:
        yield url


@contextmanager
def _process(cmd: list[str], port: int, what: str) -> Iterator[str]:
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with status {proc.returncode}")
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{what} did not answer {url}/health within 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True)
class RemoteTier:
    """How ``dg-remote`` reaches its draft worker."""

    delay_ms: float = 0.0  # added each way by a delay proxy (0: straight to the worker)
    prefetch: bool = True  # the proposer's precomputation (DRAFTGATE_VLLM_PREFETCH)

    def url(self, stack: ExitStack) -> str:
        wport = free_port()
        cmd = [
            sys.executable,
            "-m",
            "draftgate",
            "serve-draft",
            "--drafter",
            "ngram",
            "--port",
            str(wport),
            "--log-level",
            "warning",
        ]
        worker = stack.enter_context(_process(cmd, wport, "the draft worker"))
        if self.delay_ms <= 0:
            return worker
        port = stack.enter_context(DelayProxy(("127.0.0.1", int(worker.rsplit(":", 1)[1])), self.delay_ms / 1000.0))
        return f"http://127.0.0.1:{port}"


def start_servers(
    stack: ExitStack, env: VllmEnv, arms: Sequence[Arm], k: int, ngram_k: int, logs: Path, remote: RemoteTier
) -> tuple[dict[str, str], str | None]:
    """Start the vLLM processes the arms need, one after another; their URLs, and the proposer's side server."""
    need = {a.server for a in arms}
    urls: dict[str, str] = {}
    control = None
    for server in ("plain", "ngram", "draftgate"):
        if server not in need:
            continue
        print(f"starting vLLM ({server}) ...", file=sys.stderr, flush=True)
        spec: dict[str, Any] | None = None
        extra: dict[str, str] = {}
        if server == "ngram":
            spec = {
                "method": "ngram",
                "num_speculative_tokens": ngram_k,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
        elif server == "draftgate":
            spec = draftgate_spec(k)
            port = free_port()
            extra["DRAFTGATE_VLLM_CONTROL_PORT"] = str(port)
            control = f"http://127.0.0.1:{port}"
            if any(a.name == "dg-remote" for a in arms):
                extra["DRAFTGATE_VLLM_DRAFT_URL"] = remote.url(stack)
                extra["DRAFTGATE_VLLM_PREFETCH"] = "1" if remote.prefetch else "0"
        # vLLM alone also serves its token route: the gateway arms' rounds score through it.
        launch = VllmLaunch(env, spec, extra, log=logs / f"vllm-{server}.log", scale_out=server == "plain")
        urls[server] = stack.enter_context(vllm_server(launch))
    for a in arms:
        if a.gateway is not None:
            print(f"starting the DraftGate gateway ({a.name}) ...", file=sys.stderr, flush=True)
            urls[a.name] = stack.enter_context(_gateway(urls[a.server], a.gateway, free_port()))
    return urls, control
