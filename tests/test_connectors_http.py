"""The endpoints' HTTP server under abuse: half-open and slow clients, oversized heads, crowds.

Real sockets against `MetricsServer` (what `cbo-agent run` serves /metrics, /healthz and
/readyz with); the thread count is the process's own (`/proc/self/status`).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from connectors.http_server import Limits
from connectors.metrics import AgentMetrics, MetricsServer, MetricsUnavailable, Readiness
from tests.test_connectors_metrics import fetch

HALF_OPEN = 300


def os_threads() -> int:
    """Threads of this process as the kernel counts them (also threads Python did not start)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return threading.active_count()


def half_open(port: int, count: int) -> list[socket.socket]:
    """`count` connections that send part of a request head and then nothing."""
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: unfinished
        clients.append(client)
    return clients


def closed_by_server(client: socket.socket, within_s: float) -> bool:
    client.settimeout(within_s)
    try:
        return client.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.mark.integration
def test_half_open_requests_leave_the_thread_count_flat_and_healthz_answers():
    metrics = AgentMetrics()
    with MetricsServer(metrics.registry, Readiness(), port=0) as server:
        assert fetch(server.url + "/healthz")[0] == 200
        before = os_threads()
        clients = half_open(server.port, HALF_OPEN)
        try:
            time.sleep(0.5)  # let the server accept them all
            during = os_threads()
            started = time.monotonic()
            status, _, body = fetch(server.url + "/healthz")
            answered_s = time.monotonic() - started
            assert (status, body) == (200, "ok\n")
            assert fetch(server.url + "/metrics")[0] == 200
        finally:
            for client in clients:
                client.close()
        assert during <= before, f"threads {before} -> {during} under {HALF_OPEN} half-open"
        assert answered_s < 2.0
        assert server.http.open_connections <= server.http.limits.max_connections
        assert server.http.evicted >= HALF_OPEN - server.http.limits.max_connections


@pytest.mark.integration
def test_a_client_that_never_finishes_its_request_is_closed_after_the_head_timeout():
    limits = Limits(head_timeout_s=0.5)
    with MetricsServer(AgentMetrics().registry, Readiness(), limits=limits) as server:
        (client,) = half_open(server.port, 1)
        with client:
            started = time.monotonic()
            assert closed_by_server(client, within_s=5.0)
            assert 0.4 < time.monotonic() - started < 3.0
        assert server.http.timed_out == 1
        # a byte every 0.1 s (a slow-loris) does not extend it: the timeout covers the whole head
        with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as slow:
            started, closed_after = time.monotonic(), None
            for byte in b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1\r\n" * 2:
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    closed_after = time.monotonic() - started
                    break
                if closed_by_server(slow, within_s=0.1):
                    closed_after = time.monotonic() - started
                    break
            assert closed_after is not None and closed_after < 2.0, closed_after


@pytest.mark.integration
def test_bad_requests_get_their_status_and_head_has_no_body():
    limits = Limits(max_head_bytes=1024)
    with MetricsServer(AgentMetrics().registry, Readiness("x"), limits=limits) as server:

        def ask(raw: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as client:
                client.sendall(raw)
                chunks = []
                while chunk := client.recv(65536):
                    chunks.append(chunk)
                return b"".join(chunks)

        assert ask(b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405 ")
        assert ask(b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        huge = b"GET /healthz HTTP/1.1\r\nX-Pad: " + b"a" * 4096 + b"\r\n\r\n"
        assert ask(huge).startswith(b"HTTP/1.1 431 ")
        head = ask(b"HEAD /readyz HTTP/1.1\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and head.endswith(b"\r\n\r\n")
        assert b"Connection: close" in head
        assert ask(b"GET /healthz?probe=1 HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\nok\n")


def test_a_port_in_use_raises_at_start():
    with MetricsServer(AgentMetrics().registry, Readiness()) as first:
        second = MetricsServer(AgentMetrics().registry, Readiness(), port=first.port)
        with pytest.raises(MetricsUnavailable, match=f"127.0.0.1:{first.port}"):
            second.start()
        second.close()
