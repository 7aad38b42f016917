"""A small HTTP/1.1 GET server that slow or hostile clients cannot exhaust.

Built for the agent's probe and scrape endpoints (`connectors.metrics.MetricsServer`): one
daemon thread runs its own asyncio event loop, and every connection is a coroutine on it, never
a thread — so the process's thread count does not move with the number of clients. Limits:

- `head_timeout_s`: the whole request head (request line and headers) must arrive within this
  long of the connection opening, else the connection is closed (no slow-loris);
- `write_timeout_s`: a reply the client does not read within this long is abandoned;
- `max_connections`: at most this many connections are open; a new one beyond it closes the
  oldest connection still waiting for its request head (so a crowd of half-open connections
  cannot lock a prober out), or, when none is waiting, is itself closed at once;
- `max_head_bytes`: a longer request head is answered 431 and closed.

Every reply carries ``Connection: close``: one request per connection, so there is no idle
keep-alive connection to time out. Only GET and HEAD are served (405 otherwise).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from types import TracebackType
from typing import Final, Self
from urllib.parse import urlsplit

import structlog

log = structlog.get_logger(__name__)

HEAD_TIMEOUT_S: Final = 5.0
WRITE_TIMEOUT_S: Final = 10.0
MAX_CONNECTIONS: Final = 64
MAX_HEAD_BYTES: Final = 8192
_CLOSE_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class Reply:
    """What a route answers: a status, a body and its content type."""

    status: HTTPStatus
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


Route = Callable[[], Reply]


@dataclass(frozen=True)
class Limits:
    """The server's limits (module docstring); the defaults suit a Prometheus scrape."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    write_timeout_s: float = WRITE_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS
    max_head_bytes: int = MAX_HEAD_BYTES

    def __post_init__(self) -> None:
        if not (self.head_timeout_s > 0 and self.write_timeout_s > 0):
            raise ValueError("timeouts must be positive")
        if self.max_connections < 1 or self.max_head_bytes < 64:
            raise ValueError("need max_connections >= 1 and max_head_bytes >= 64")


class BoundedHttpServer:
    """Serve `routes` (path -> reply) on (host, port) from one thread; a context manager.

    `start` binds (an `OSError` such as "address in use" is raised there, in the caller's
    thread) and then serves; `port=0` picks a free port. A route that raises is answered 500.
    """

    def __init__(
        self,
        routes: dict[str, Route],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        name: str = "http",
    ) -> None:
        self._routes = dict(routes)
        self._address = (host, port)
        self.limits = limits or Limits()
        self._name = name
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        # connections still waiting for their request head, oldest first (evicted at the cap)
        self._waiting: collections.OrderedDict[int, asyncio.StreamWriter] = (
            collections.OrderedDict()
        )
        self._open = 0
        self.evicted = 0  # connections closed to make room: how often the cap was reached
        self.timed_out = 0  # connections closed because their head or reply took too long

    @property
    def port(self) -> int:
        """The bound port (only once started)."""
        if self._socket is None:
            raise RuntimeError(f"{self._name} server not started")
        return int(self._socket.getsockname()[1])

    @property
    def host(self) -> str:
        return self._address[0]

    @property
    def open_connections(self) -> int:
        return self._open

    def start(self) -> None:
        """Bind and serve in a daemon thread; OSError if the address cannot be bound."""
        if self._socket is not None:
            raise RuntimeError(f"{self._name} server already started")
        family = socket.AF_INET6 if ":" in self._address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self._address)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._socket = sock
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve_in_thread, args=(sock, ready), name=self._name, daemon=True
        )
        self._thread.start()
        ready.wait()

    def close(self) -> None:
        """Stop serving, close every connection and release the port; safe to call twice."""
        sock, self._socket = self._socket, None
        if sock is None:
            return
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(timeout=_CLOSE_TIMEOUT_S)
        sock.close()

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

    # ------------------------------------------------------------------ the server's thread
    def _serve_in_thread(self, sock: socket.socket, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(sock, ready))
        finally:
            ready.set()
            loop.close()

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        server = await asyncio.start_server(
            self._connection, sock=sock, limit=self.limits.max_head_bytes
        )
        ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            for writer in list(self._waiting.values()):
                writer.close()
            # the stdlib's wait_closed also waits for handlers; they are bounded by the limits
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _CLOSE_TIMEOUT_S)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self.limits.max_connections and not self._make_room():
            writer.close()
            return
        self._open += 1
        key = id(writer)
        self._waiting[key] = writer
        try:
            head = await self._read_head(reader)
            self._waiting.pop(key, None)
            if head is not None:
                await self._answer(head, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        finally:
            self._waiting.pop(key, None)
            self._open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), self.limits.write_timeout_s)

    def _make_room(self) -> bool:
        """Close the oldest connection still sending its head; False if there is none."""
        if not self._waiting:
            return False
        _, oldest = self._waiting.popitem(last=False)
        oldest.close()
        self.evicted += 1
        return True

    async def _read_head(self, reader: asyncio.StreamReader) -> bytes | Reply | None:
        """The request head, a Reply for a bad one, or None when the client is too slow."""
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.head_timeout_s)
        except TimeoutError:
            self.timed_out += 1
            return None
        except asyncio.LimitOverrunError:
            return Reply(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, b"request head too large\n")

    async def _answer(self, head: bytes | Reply, writer: asyncio.StreamWriter) -> None:
        method = "GET"
        if isinstance(head, Reply):
            reply = head
        else:
            method, reply = self._route(head)
        status = reply.status
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"Content-Type: {reply.content_type}",
            f"Content-Length: {len(reply.body)}",
            "Connection: close",
            "",
            "",
        ]
        writer.write("\r\n".join(lines).encode("latin-1"))
        if method != "HEAD":
            writer.write(reply.body)
        try:
            await asyncio.wait_for(writer.drain(), self.limits.write_timeout_s)
        except TimeoutError:
            self.timed_out += 1

    def _route(self, head: bytes) -> tuple[str, Reply]:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "GET", Reply(HTTPStatus.BAD_REQUEST, b"bad request line\n")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return method, Reply(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET and HEAD\n")
        route = self._routes.get(urlsplit(target).path)
        if route is None:
            return method, Reply(HTTPStatus.NOT_FOUND, b"not found\n")
        try:
            return method, route()
        except Exception as error:  # a broken route answers 500, it never kills the server
            log.warning("http.route_failed", path=target, error=repr(error))
            return method, Reply(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
