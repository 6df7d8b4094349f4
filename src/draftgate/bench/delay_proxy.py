"""A TCP proxy on loopback that delays every byte by a fixed time each way: a network in a box.

Benchmarks put it between a client and a server to measure what a network round trip costs
(``tc netem`` needs a kernel module that containers often lack). Each chunk read from one side
is written to the other ``delay_s`` after it arrived, in order; bandwidth is not limited.

    with DelayProxy(("127.0.0.1", worker_port), delay_s=0.002) as port:
        ...  # connect to 127.0.0.1:port: 2 ms one way, 4 ms round trip added
"""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

__all__ = ["DelayProxy"]


class DelayProxy:
    """Forwards 127.0.0.1:``port`` to ``target`` with ``delay_s`` added each way (a daemon thread)."""

    def __init__(self, target: tuple[str, int], delay_s: float) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.target, self.delay_s = target, delay_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-proxy", daemon=True)

    def __enter__(self) -> int:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self.port

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._thread.join(10)

    async def _close(self) -> None:
        """Stop listening, end every connection's tasks quietly, then the loop."""
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.get_running_loop().call_soon(self._loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come; each goes out ``delay_s`` after it arrived, in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - loop.time()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(send())
        try:
            while data := await reader.read(65536):
                queue.put_nowait((loop.time() + self.delay_s, data))
        except OSError:  # the peer reset: end this direction
            pass
        finally:
            queue.put_nowait((0.0, b""))
            await asyncio.gather(sender, return_exceptions=True)
            writer.close()
