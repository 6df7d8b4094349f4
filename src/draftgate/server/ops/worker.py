"""A bounded background worker: jobs off the request path, dropped when the queue is full.

One daemon thread runs the jobs in order. ``cpu_share`` bounds the share of one
core it uses: after a job that took t seconds it idles t * (1/share - 1).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

__all__ = ["BackgroundWorker"]

log = logging.getLogger("draftgate.server.ops")


class BackgroundWorker:
    def __init__(self, name: str, max_queue: int = 64, cpu_share: float = 0.25) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue!r}")
        if not 0.0 < cpu_share <= 1.0:
            raise ValueError(f"cpu_share must be in (0, 1], got {cpu_share!r}")
        self.name = name
        self.cpu_share = cpu_share
        self.dropped = 0
        self.done = 0
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue a job; False (and counted as dropped) when the queue is full."""
        self._ensure_started()
        try:
            self._q.put_nowait(job)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def idle(self) -> bool:
        return self._q.unfinished_tasks == 0

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def stop(self) -> None:
        if self._thread is not None:
            try:
                self._q.put(None, timeout=1.0)
            except queue.Full:
                pass
            self._thread.join(timeout=5.0)
            self._thread = None

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"draftgate-{self.name}", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            try:
                if job is None:
                    return
                t0 = time.perf_counter()
                try:
                    job()
                except Exception:  # a failed background job is logged, never fatal
                    log.exception("%s job failed", self.name)
                self.done += 1
                time.sleep((time.perf_counter() - t0) * (1.0 / self.cpu_share - 1.0))
            finally:
                self._q.task_done()
