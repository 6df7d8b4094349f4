"""The live vLLM set-up shared by the vLLM test modules (their fixtures are in conftest.py).

Two vLLM servers on the bundled model, started once per test session: ``plain`` (no
speculation: the reference) and ``spec`` (DraftGate's proposer, K up to 8, a remote draft
worker, the side server on), and the n-gram draft worker ``spec`` drafts from.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from gateway_support import serve_app

from draftgate.drafters.ngram import NgramDrafter
from draftgate.integrations.vllm.tools.launch import free_port
from draftgate.server.workers.draft_worker import DraftService, create_draft_app

ROOT = Path(__file__).resolve().parents[3]


class Worker:
    """A `draftgate serve-draft`-style n-gram draft worker on a fixed port, that tests stop and swap."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, app: FastAPI | None = None) -> None:
        ready, self._stop = threading.Event(), threading.Event()
        app = app or create_draft_app(DraftService(NgramDrafter()))

        def run(stop: threading.Event) -> None:
            with serve_app(app, port=self.port):
                ready.set()
                stop.wait()

        self._thread = threading.Thread(target=run, args=(self._stop,), daemon=True)
        self._thread.start()
        assert ready.wait(30), "the draft worker did not start"

    def stop(self) -> None:
        assert self._stop is not None and self._thread is not None
        self._stop.set()
        self._thread.join(30)


class Spec:
    """The vLLM server with DraftGate's proposer, and its side server (``control``)."""

    def __init__(self, url: str, control: str, log: Path) -> None:
        self.url, self.control, self.log = url, control, log

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.control}/stats", timeout=10).json()  # type: ignore[no-any-return]

    def drafter(self, name: str) -> dict[str, int]:
        return self.stats()["drafters"][name]  # type: ignore[no-any-return]

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Wait until vLLM runs and queues no request (an aborted one may draft a few more rounds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = httpx.get(f"{self.url}/metrics", timeout=10).text
            busy = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
            ]
            if busy and not any(busy):
                return
            time.sleep(0.1)
        raise AssertionError(f"vLLM at {self.url} still busy after {timeout:.0f} s")
