"""A TCP proxy on 127.0.0.1 whose connections can be cut: how the chaos run severs the agent's link.

`TcpProxy` listens on a loopback port and forwards every connection to an upstream address (the
broker) byte for byte. `cut()` severs every open connection abruptly — both sides are aborted with
SO_LINGER 0, so each peer gets a TCP reset, not a polite FIN — and may refuse new connections for
a moment (accepted and reset at once), while the broker and every other client stay up. The proxy
runs its own asyncio loop in a daemon thread, so a synchronous harness can drive it; every
public method is thread-safe and bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

__all__ = ["TcpProxy"]

HOST = "127.0.0.1"
CONNECT_TIMEOUT_S = 5.0
CALL_TIMEOUT_S = 10.0
CHUNK = 65536
T = TypeVar("T")


class _Link:
    """One proxied connection: the client's side and the upstream side."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close at once with a TCP reset (SO_LINGER on, timeout 0), dropping unsent data."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF or an error."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()


class TcpProxy:
    """Forward ``127.0.0.1:port`` to ``upstream_host:upstream_port``; sever on demand.

    Args:
        upstream_port: where connections go (the broker's port).
        upstream_host: its address (loopback).
        port: the port to listen on (0 picks a free one; see `port` once started).

    Counters (read from any thread): `accepted` connections forwarded, `refused` connections
    reset during a refusal window or because the upstream was down, `cuts` calls of `cut` that
    severed at least one connection, `severed` connections severed in all.
    """

    def __init__(self, upstream_port: int, upstream_host: str = HOST, port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._requested_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refuse_until = 0.0
        self.accepted = 0
        self.refused = 0
        self.cuts = 0
        self.severed = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """``mqtt://127.0.0.1:<port>``: what a client uses instead of the broker's URL."""
        return f"mqtt://{HOST}:{self.port}"

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("proxy already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self._server = self._call(self._listen())

    def close(self) -> None:
        """Stop listening, reset every connection, stop the loop; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(CALL_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=CALL_TIMEOUT_S)
        if not loop.is_running():
            loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ control
    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    def cut(self, refuse_s: float = 0.0) -> int:
        """Reset every open connection; refuse new ones for `refuse_s`. Returns how many."""

        async def sever() -> int:
            self._refuse_until = time.monotonic() + refuse_s
            links = list(self._links)
            for link in links:
                link.abort()
            self._links.difference_update(links)
            self.severed += len(links)
            self.cuts += bool(links)
            return len(links)

        return self._call(sever())

    def wait_for_connection(self, timeout_s: float, poll_s: float = 0.02) -> bool:
        """Whether a connection is open within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self._links:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    # ------------------------------------------------------------------ the loop's side
    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            raise RuntimeError("proxy not started")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(CALL_TIMEOUT_S)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, HOST, self._requested_port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(reader, writer)
        except asyncio.CancelledError:
            pass  # closing: the streams' callback would report a cancelled handler as an error
        finally:
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            self.refused += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            self.refused += 1  # the upstream is down: the client sees its connection reset
            _reset(writer)
            return
        link = _Link(writer, up_writer)
        self._links.add(link)
        self.accepted += 1
        pumps = [
            asyncio.create_task(_pump(reader, up_writer)),
            asyncio.create_task(_pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            if link in self._links:  # one side closed: close the other (not a cut)
                self._links.discard(link)
                for side in (link.client, link.upstream):
                    side.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()
        if self._tasks:  # the resets end every pump; cancel whatever has not noticed yet
            _, late = await asyncio.wait(list(self._tasks), timeout=2.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
