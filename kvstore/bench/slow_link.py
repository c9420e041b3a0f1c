"""A TCP proxy on loopback that adds latency and limits bandwidth: a distant or slow Redis.

    with SlowLink("127.0.0.1:6379", latency_s=0.05, bytes_per_s=4e6) as link:
        url = link.url  # redis://127.0.0.1:<port>/0

Each direction of each connection delivers what it read `latency_s` later, in order, and no
faster than `bytes_per_s` (each direction of each connection paced on its own). It runs its own
asyncio loop on a thread, so engines and Redis clients in the same process see a real socket.
Used by `kvstore bench remote` and the tests of `load_policy: cost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from types import TracebackType

__all__ = ["SlowLink"]

_READ_BYTES = 64 * 1024


class SlowLink:
    def __init__(self, upstream: str, *, latency_s: float, bytes_per_s: float) -> None:
        if latency_s < 0 or bytes_per_s <= 0:
            raise ValueError("latency_s must be >= 0 and bytes_per_s > 0")
        host, _, port = upstream.rpartition(":")
        self._upstream = (host or "127.0.0.1", int(port))
        self.latency_s = latency_s
        self.bytes_per_s = bytes_per_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> SlowLink:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.ensure_future(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Read as it comes; deliver each piece `latency_s` after it was read, paced."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.ensure_future(self._deliver(queue, dst))
        try:
            while data := await src.read(_READ_BYTES):
                queue.put_nowait((time.monotonic() + self.latency_s, data))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(BaseException):
                await deliver

    async def _deliver(
        self, queue: asyncio.Queue[tuple[float, bytes]], dst: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                due_s, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due_s - time.monotonic()))
                dst.write(data)
                await dst.drain()
                await asyncio.sleep(len(data) / self.bytes_per_s)
        except OSError:
            pass
        finally:
            dst.close()
