"""The delay proxy forwards bytes both ways, in order, and adds at least its delay each way."""

from __future__ import annotations

import socket
import socketserver
import threading
import time

import pytest

from draftgate.bench.delay_proxy import DelayProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture()
def echo() -> tuple[str, int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address  # type: ignore[misc]
    server.shutdown()
    server.server_close()


def _round_trip(port: int, payload: bytes) -> tuple[bytes, float]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.perf_counter()
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += s.recv(65536)
        return got, time.perf_counter() - t0


def test_forwards_in_order_and_delays_each_way(echo: tuple[str, int]) -> None:
    payload = bytes(range(256)) * 1000  # several chunks each way
    with DelayProxy(echo, delay_s=0.03) as port:
        got, seconds = _round_trip(port, payload)
        assert got == payload
        assert seconds >= 0.06  # 30 ms out, 30 ms back, at the least
    with DelayProxy(echo, delay_s=0.0) as port:
        assert _round_trip(port, b"ping")[0] == b"ping"


def test_refuses_a_negative_delay_and_closes_when_the_target_is_down() -> None:
    with pytest.raises(ValueError, match="delay_s must be >= 0"):
        DelayProxy(("127.0.0.1", 9), -1.0)
    with DelayProxy(("127.0.0.1", 9), 0.0) as port, socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        assert s.recv(10) == b""  # nothing listens behind it: the proxy hangs up
