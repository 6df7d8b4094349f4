"""The processes one arm of a vLLM comparison runs (``integrations.vllm.tools.compare``): its own
vLLM server, a DraftGate gateway in front of it for the gateway arms, a draft worker for the remote
arm; each started on loopback and stopped when the arm's pass ends, so one arm is up at a time."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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

__all__ = ["Arm", "ArmServers", "RemoteTier", "arm_servers"]


@dataclass(frozen=True)
class Arm:
    name: str
    server: str  # "plain" | "ngram" | "suffix" | "draftgate": how its vLLM is started
    xargs: Mapping[str, Any] = field(default_factory=dict)
    what: str = ""
    gateway: str | None = None  # a DraftGate gateway with this drafter in front of the server (its own rounds)


@contextmanager
def _gateway(target: str, drafter: str, port: int, log: Path) -> Iterator[str]:
    """`draftgate serve` in its own process: one route named as vLLM's model, its target the vLLM server;
    its log (info: the route's decisions, such as rounds not paying) appended to ``log``."""
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
        "info",
    ]
    with open(log, "ab") as out, _process(cmd, port, "the gateway", out) as url:
        yield url


@contextmanager
def _process(cmd: list[str], port: int, what: str, out: IO[bytes] | None = None) -> Iterator[str]:
    proc = subprocess.Popen(cmd, stdout=out, stderr=out)
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


# vLLM's speculative config per kind of server (None: plain decoding).
def _spec(server: str, k: int, ngram_k: int) -> dict[str, Any] | None:
    if server == "ngram":
        return {"method": "ngram", "num_speculative_tokens": ngram_k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    if server == "suffix":
        # vLLM's defaults (tree depth 24, K up to 24, spec factor 1, min token probability 0.1): what a user gets.
        return {"method": "suffix"}
    if server == "draftgate":
        return draftgate_spec(k)
    return None


@dataclass(frozen=True)
class ArmServers:
    url: str  # where the arm's requests go: its gateway, or vLLM itself
    vllm: str  # the vLLM server behind it
    control: str | None  # the proposer's side server (DraftGate arms inside vLLM)


@contextmanager
def arm_servers(env: VllmEnv, arm: Arm, k: int, ngram_k: int, logs: Path, remote: RemoteTier) -> Iterator[ArmServers]:
    """The processes one arm needs, and nothing else: its own vLLM (with the gateway in front for
    ``gw-*`` arms, the draft worker for ``dg-remote``), stopped when the block ends."""
    with ExitStack() as stack:
        extra: dict[str, str] = {}
        control = None
        if arm.server == "draftgate":
            port = free_port()
            extra["DRAFTGATE_VLLM_CONTROL_PORT"] = str(port)
            control = f"http://127.0.0.1:{port}"
            if arm.name == "dg-remote":
                extra["DRAFTGATE_VLLM_DRAFT_URL"] = remote.url(stack)
                extra["DRAFTGATE_VLLM_PREFETCH"] = "1" if remote.prefetch else "0"
        # A gateway's rounds score through vLLM's token route (--enable-scale-out).
        launch = VllmLaunch(
            env,
            _spec(arm.server, k, ngram_k),
            extra,
            log=logs / f"vllm-{arm.name}.log",
            scale_out=arm.gateway is not None,
        )
        vllm = stack.enter_context(vllm_server(launch))
        url = vllm
        if arm.gateway is not None:
            url = stack.enter_context(_gateway(vllm, arm.gateway, free_port(), logs / f"gateway-{arm.name}.log"))
        yield ArmServers(url, vllm, control)
