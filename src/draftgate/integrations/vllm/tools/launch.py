"""Start a real vLLM server on loopback from another Python (the live tests, the demo, the benchmark).

vLLM lives in its own virtualenv (``scripts/vllm_env.sh`` makes it and prints its python and
the bundled model's Hugging Face folder); this module only spawns ``python -m
vllm.entrypoints.openai.api_server`` there, waits until ``/health`` answers, and stops the whole
process group on exit. No vLLM import here.

The flags are the ones that run vLLM's CPU build here: float32, eager mode, prefix caching,
32-token KV blocks (the CPU back end needs a multiple of 32), a fixed seed, loopback
addresses for its internal message queue.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from draftgate.errors import DraftGateError

__all__ = [
    "SERVED_NAME",
    "VllmEnv",
    "VllmLaunch",
    "VllmStartError",
    "draftgate_spec",
    "free_port",
    "vllm_env",
    "vllm_server",
]

SERVED_NAME = "smol"
STARTUP_TIMEOUT_S = 600.0


class VllmStartError(DraftGateError, RuntimeError):
    """vLLM did not come up; the message holds the end of its log."""


@dataclass(frozen=True)
class VllmEnv:
    python: Path  # the vLLM virtualenv's interpreter
    model: Path  # a Hugging Face folder vLLM can load


def vllm_env(script: Path) -> VllmEnv:
    """Run ``scripts/vllm_env.sh`` (installs once, minutes; cached, seconds) and read what it prints."""
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VllmStartError(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    found = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    try:
        return VllmEnv(Path(found["VLLM_PYTHON"]), Path(found["VLLM_MODEL"]))
    except KeyError as e:
        raise VllmStartError(f"{script} printed no {e.args[0]}=...; its output:\n{proc.stdout}") from None


def draftgate_spec(k: int = 8, proposer: str = "Proposer") -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for DraftGate's proposer."""
    return {"method": "custom_class", "model": f"draftgate.integrations.vllm.{proposer}", "num_speculative_tokens": k}


@dataclass(frozen=True)
class VllmLaunch:
    """One vLLM server: the model, its speculative config (None: plain decoding), extra environment."""

    env: VllmEnv
    speculative: Mapping[str, Any] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    port: int = 0  # 0: a free port
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    log: Path | None = None  # where its output goes (None: discarded)
    scale_out: bool = False  # --enable-scale-out: the token-in/token-out route the gateway's rounds score through

    def command(self, port: int) -> list[str]:
        cmd = [
            str(self.env.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.env.model),
            "--served-model-name",
            SERVED_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--enable-prefix-caching",
            "--enforce-eager",
            "--seed",
            "0",
            "--block-size",
            "32",
        ]
        if self.scale_out:
            cmd.append("--enable-scale-out")
        if self.speculative is not None:
            cmd += ["--speculative-config", json.dumps(dict(self.speculative))]
        return cmd

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.update(
            VLLM_HOST_IP="127.0.0.1",
            VLLM_LOOPBACK_IP="127.0.0.1",
            VLLM_CPU_KVCACHE_SPACE=str(self.kv_cache_gib),
            HF_HUB_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path | None, n: int = 40) -> str:
    if path is None or not path.exists():
        return "(no log kept: pass log=PATH)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@contextmanager
def vllm_server(launch: VllmLaunch, timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Run vLLM until the block ends; yield its base URL (``http://127.0.0.1:PORT``)."""
    port = launch.port or free_port()
    url = f"http://127.0.0.1:{port}"
    out = open(launch.log, "ab") if launch.log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        launch.command(port), env=launch.environment(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_healthy(proc, url, launch.log, timeout_s)
        yield url
    finally:
        _stop(proc)
        if out is not subprocess.DEVNULL:
            out.close()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path | None, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise VllmStartError(f"vLLM exited with status {proc.returncode} while starting:\n{_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise VllmStartError(f"vLLM did not answer {url}/health within {timeout_s:.0f} s:\n{_tail(log)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to vLLM's process group (API server, engine core, workers), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    try:  # the engine core may outlive the API server that started it
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
