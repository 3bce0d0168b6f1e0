"""The node-side probes: a stall-based liveness, the three routes, and the probe listener's
bounds on connections, headers and memory. Waits are on the sockets and the listener's
counts, never fixed sleeps."""

from __future__ import annotations

import contextlib
import http.client
import os
import selectors
import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from devkit.procs import wait_until
from gpufrag.httpserve import Server
from gpufrag.probes import (
    PROBE_MAX_CONNECTIONS,
    PROBE_MAX_HEADER_BYTES,
    Liveness,
    respond,
    start_http_server,
)
from tests.sockets import send_and_read_to_close


def test_alive_until_the_first_tick_then_stalled_after_the_deadline() -> None:
    now = [100.0]
    liveness = Liveness(lambda: now[0], stall_after_s=10)
    assert liveness.live()
    liveness.tick()
    now[0] = 110.0
    assert liveness.live()
    now[0] = 110.5
    assert not liveness.live()
    liveness.tick(now=110.5)
    assert liveness.live()


def test_a_call_stuck_past_its_bound_fails_liveness_while_the_loop_ticks() -> None:
    """Liveness reflects the work: a ticking supervisor loop does not make a component whose
    request path is stuck (a deadlock, a call that never returns) look alive."""
    now = [100.0]
    liveness = Liveness(lambda: now[0], stall_after_s=10, stuck_after_s=30)
    with liveness.working("Allocate (nvidia.com/gpu)"):
        now[0] += 30
        liveness.tick()
        assert liveness.live()
        now[0] += 1
        liveness.tick()
        assert not liveness.live()
        assert liveness.why_not_live() == "Allocate (nvidia.com/gpu) in progress for 31s " \
                                          "(bound 30s)"
    assert liveness.live() and liveness.why_not_live() == ""  # the call came back


def test_routes_say_what_the_component_waits_for() -> None:
    def answer(path: str, live: bool, ready: bool) -> tuple[int, bytes]:
        status, _, body = respond(path, lambda: b"m 1\n", lambda: live, lambda: ready,
                                  stalled="stalled: x", not_ready="not ready: y")
        return status, body

    assert answer("/metrics?x=1", False, False) == (200, b"m 1\n")
    assert answer("/healthz", True, False) == (200, b"ok\n")
    assert answer("/healthz", False, True) == (503, b"stalled: x\n")
    assert answer("/readyz", True, True) == (200, b"ready\n")
    assert answer("/readyz", True, False) == (503, b"not ready: y\n")
    assert answer("/other", True, True)[0] == 404


# ------------------------------------------------------------------ the probe listener itself


def _answer(path: str) -> tuple[int, str, bytes]:
    return respond(path, lambda: b"m 1\n", lambda: True, lambda: True,
                   stalled="stalled", not_ready="not ready")


@pytest.fixture
def listener() -> Iterator[Server]:
    server = start_http_server(0, _answer, name="probes-test", host="127.0.0.1")
    try:
        yield server
    finally:
        server.stop()


def _closed(sock: socket.socket) -> bool:
    """Read what the server sends until it closes ``sock`` (an orderly close or a reset: the
    kernel may do either); False while it is open."""
    try:
        while chunk := sock.recv(65536):
            del chunk
    except BlockingIOError:
        return False
    except ConnectionResetError:
        pass
    return True


def _slow_sender(port: int, head: bytes) -> socket.socket:
    """A connection whose request headers never end: ``head`` sent, no blank line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setblocking(False)
    with contextlib.suppress(OSError):  # closed unread already, or the kernel's buffer full
        sock.send(head)
    return sock


def test_a_full_probe_listener_closes_new_connections_unread_and_answers_those_it_holds(
        listener: Server) -> None:
    scrape = http.client.HTTPConnection("127.0.0.1", listener.port, timeout=10)
    slow: list[socket.socket] = []
    try:
        scrape.request("GET", "/healthz")  # a kept-alive connection, as Prometheus keeps one
        assert scrape.getresponse().read() == b"ok\n"
        slow = [_slow_sender(listener.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: a")
                for _ in range(PROBE_MAX_CONNECTIONS + 8)]
        # The listener fills (the scrape's place and 15 slow ones); the other 9 are closed.
        wait_until(lambda: listener.connections.refused == 9, timeout_s=10, interval_s=0.01,
                   what="the connections over the cap refused")
        assert listener.connections.held == PROBE_MAX_CONNECTIONS
        scrape.request("GET", "/readyz")  # answered while the listener is full
        assert scrape.getresponse().read() == b"ready\n"
        # The slow ones are cut off at the header deadline, and new probes get in again.
        watched = selectors.DefaultSelector()
        for sock in slow:
            watched.register(sock, selectors.EVENT_READ)
        started = time.monotonic()
        while watched.get_map():
            assert time.monotonic() - started < 10, f"{len(watched.get_map())} still open"
            for key, _ in watched.select(timeout=1.0):
                assert isinstance(key.fileobj, socket.socket)
                if _closed(key.fileobj):
                    watched.unregister(key.fileobj)
        watched.close()
        assert listener.connections.late == PROBE_MAX_CONNECTIONS - 1
        with urllib.request.urlopen(f"http://127.0.0.1:{listener.port}/healthz",
                                    timeout=10) as reply:
            assert reply.read() == b"ok\n"
    finally:
        scrape.close()
        for sock in slow:
            sock.close()


@pytest.mark.parametrize("size", [PROBE_MAX_HEADER_BYTES + 1, 16 * 1024, 60 * 1024])
def test_probe_request_headers_over_8_kib_are_refused(listener: Server, size: int) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    data = head + b"a" * (size - len(head) - 4) + b"\r\n\r\n"
    assert len(data) == size
    answer = send_and_read_to_close(listener.port, data)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:80]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Slow header senders, and the most the probe listener's process may grow while they send.
# With the cap, 16 at most are held at once, each for as long as one read of up to 64 KiB
# takes the parser to refuse it; the rest is what the allocator keeps of those reads once
# freed, a few MiB however many senders come. Without the cap and the 8 KiB bound, each one
# held its ~60 KiB and the server's state (~130 KiB in all, measured on the server before
# uvicorn) until the keep-alive ended it: 400 of them are several times this bound.
SLOW_SENDERS = 400
GROWTH_BOUND_BYTES = 16 * 1024 * 1024


def test_slow_header_senders_grow_the_probe_listeners_process_by_a_bounded_amount(
        listener: Server) -> None:
    # Each sends 60 KiB of headers that never end and waits (the parser keeps them all: the door
    # refuses them past the listener's 8 KiB, gpufrag.connlimit). The peak of the process's resident
    # memory is read as each sender is added and while the server answers them, until it has closed
    # every one (refused over the cap, or 431 past the 8 KiB bound) or the growth is past the bound.
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * (60 * 1024)
    before = peak = _rss_bytes()
    watched = selectors.DefaultSelector()
    slow: list[socket.socket] = []
    try:
        for _ in range(SLOW_SENDERS):
            slow.append(_slow_sender(listener.port, head))
            watched.register(slow[-1], selectors.EVENT_READ)
            peak = max(peak, _rss_bytes())
        started = time.monotonic()
        while watched.get_map() and peak - before <= GROWTH_BOUND_BYTES:
            assert time.monotonic() - started < 30, f"{len(watched.get_map())} still open"
            for key, _ in watched.select(timeout=0.05):
                assert isinstance(key.fileobj, socket.socket)
                if _closed(key.fileobj):
                    watched.unregister(key.fileobj)
            peak = max(peak, _rss_bytes())
        growth_mib = (peak - before) / 2**20
        assert peak - before <= GROWTH_BOUND_BYTES, (
            f"the process grew by {growth_mib:.1f} MiB with {SLOW_SENDERS} slow senders "
            f"({len(watched.get_map())} still held)")
    finally:
        watched.close()
        for sock in slow:
            sock.close()
