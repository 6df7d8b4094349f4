"""The proposer's side server inside vLLM's worker: metrics, stats and the speculation switch.

vLLM's own ``/metrics`` is served by its API process, while the proposer lives in the worker
process; so the proposer answers on a port of its own (``DRAFTGATE_VLLM_CONTROL_PORT``,
127.0.0.1 by default):

* ``GET /metrics``: Prometheus text, ``draftgate_vllm_*`` per drafter: draft tokens, accepted
  tokens, rounds, draft calls and their seconds, failures; the remote tier's prefetch hits,
  waited calls, late and failed answers; the switch. vLLM's ``vllm:spec_decode_*`` stay vLLM's.
* ``GET /stats``: the same as JSON.
* ``GET /control``, ``POST /control`` with ``{"enabled": false}``: the deployment's runtime
  switch (the gateway's kill switch). Off, no request drafts from its next step on; vLLM keeps
  running and decodes plainly. Per-request control needs no server: ``vllm_xargs``
  (see settings).

Stats are collected once, in `ProposerCore`; this module only reports them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from draftgate.integrations.vllm.inside.remote import RemoteCounters
from draftgate.integrations.vllm.inside.rounds import ProposerCore

__all__ = ["Sidecar", "stats_json"]

log = logging.getLogger("draftgate.integrations.vllm")


def stats_json(core: ProposerCore, remote: RemoteCounters | None) -> dict[str, object]:
    out = core.snapshot()
    if remote is not None:
        out["remote"] = vars(remote).copy()
    return out


class _Collector:
    """Prometheus families read from the core's stats at scrape time."""

    def __init__(self, core: ProposerCore, remote: RemoteCounters | None) -> None:
        self.core, self.remote = core, remote

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        per_drafter = {
            "drafted_tokens": ("drafted", "Draft tokens handed to vLLM"),
            "accepted_tokens": ("accepted", "Draft tokens accepted by vLLM's verification"),
            "rounds": ("rounds", "Request rounds that drafted at least one token"),
            "draft_calls": ("calls", "Draft calls (one per step and drafter)"),
            "draft_seconds": ("draft_s", "Seconds spent drafting"),
            "draft_failures": ("failures", "Draft calls that failed (their rows got no drafts)"),
        }
        for metric, (attr, doc) in per_drafter.items():
            fam = CounterMetricFamily(f"draftgate_vllm_{metric}", doc, labels=["drafter"])
            for name, s in self.core.stats.items():
                fam.add_metric([name], float(getattr(s, attr)))
            yield fam
        if self.remote is not None:
            for metric, attr, doc in (
                ("prefetch_hits", "prefetch_hits", "Rounds drafted from a prefetched guess (no round trip waited on)"),
                ("calls", "calls", "Rounds that waited on the draft worker"),
                ("late", "late", "Waited rounds whose draft missed the deadline"),
                ("failures", "failures", "Waited rounds whose call failed"),
                ("wait_seconds", "wait_s", "Seconds rounds waited on the draft worker"),
            ):
                value = float(getattr(self.remote, attr))
                yield CounterMetricFamily(f"draftgate_vllm_remote_{metric}", doc, value=value)
        yield GaugeMetricFamily(
            "draftgate_vllm_speculation_enabled",
            "The deployment's switch (1: on)",
            value=float(self.core.control.enabled),
        )
        yield GaugeMetricFamily(
            "draftgate_vllm_requests", "Requests the proposer tracks", value=float(self.core.num_requests)
        )


class Sidecar:
    """A small HTTP server on a daemon thread; `start` returns False when the port is taken."""

    def __init__(self, core: ProposerCore, remote: RemoteCounters | None, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry

        self.core, self.remote = core, remote
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(core, remote))  # type: ignore[arg-type]
        self.host, self.port = host, port
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> bool:
        try:
            self._server = ThreadingHTTPServer((self.host, self.port), _handler(self))
        except OSError as e:  # another worker of this deployment holds it (tensor parallel ranks)
            log.info("draftgate side server not started on %s:%d: %s", self.host, self.port, e)
            return False
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="draftgate-sidecar", daemon=True).start()
        log.info("draftgate side server on http://%s:%d (/metrics, /stats, /control)", self.host, self.port)
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _handler(side: Sidecar) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
            pass  # scrapes every few seconds would flood vLLM's log

        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: object) -> None:
            self._send(code, json.dumps(obj).encode())

        def do_GET(self) -> None:
            if self.path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

                self._send(200, generate_latest(side.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/stats":
                self._json(200, stats_json(side.core, side.remote))
            elif self.path == "/control":
                self._json(200, {"enabled": side.core.control.enabled})
            else:
                self._json(404, {"error": {"message": f"no route {self.path}: try /metrics, /stats or /control"}})

        def do_POST(self) -> None:
            if self.path != "/control":
                self._json(404, {"error": {"message": f"no route {self.path}: POST /control"}})
                return
            try:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                enabled = body["enabled"] if isinstance(body, dict) else None
                if not isinstance(enabled, bool):
                    raise ValueError
            except (ValueError, KeyError):
                self._json(400, {"error": {"message": 'POST /control takes {"enabled": true|false}'}})
                return
            if enabled != side.core.control.enabled:
                log.info("draftgate speculation switched %s", "on" if enabled else "off")
            side.core.control.enabled = enabled
            self._json(200, {"enabled": enabled})

    return Handler
