"""A cheap HTTP/1.1 load generator for the serving benchmark: one thread, raw asyncio protocols.

Why not aiohttp's client (what the benchmark used before): it spent 0.4-0.5 ms of CPU per
request, as much as the server under test, on the same two cores, so the figures measured the
client as much as the server. Here each connection is an ``asyncio.Protocol`` that writes one
pre-encoded request (headers and body built once) and reads the answer by finding the end of
the headers and ``Content-Length``; nothing is decoded. On uvloop that is ~15-25 us of CPU per
request. It runs on one thread of one process, so it can never use more than one core; the
benchmark prints the CPU it did use.

Scope: answers with ``Content-Length`` (the server under test always sends one); a
``Connection: close`` answer closes that connection and the next request opens a new one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass
class Outcome:
    status: int  # 0 = the connection failed
    scheduled_s: float  # when the request was due (open loop) or issued (closed loop)
    sent_s: float  # when its bytes were written (after any wait for a free connection)
    done_s: float

    @property
    def latency_s(self) -> float:
        """What a user sees: from the scheduled send (queueing in the client included)."""
        return self.done_s - self.scheduled_s

    @property
    def server_s(self) -> float:
        """From the request leaving the client: the server's response time."""
        return self.done_s - self.sent_s


def raw_request(host: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """One HTTP/1.1 POST, keep-alive, as bytes."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request outstanding."""

    def __init__(self, on_done: Callable[[_Connection, int], None],
                 on_lost: Callable[[_Connection], None]) -> None:
        self._on_done = on_done
        self._on_lost = on_lost
        self._buffer = bytearray()
        self._need = -1  # total bytes of the answer once its headers are in
        self._status = 0
        self._close_after = False
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def send(self, payload: bytes) -> None:
        assert self.transport is not None
        self.busy = True
        self.transport.write(payload)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            if self._need < 0:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buffer[:end]).lower()
                self._status = int(head[9:12])
                at = head.find(b"\r\ncontent-length:")
                if at >= 0:
                    stop = head.find(b"\r\n", at + 2)
                    length = int(head[at + 17:stop if stop >= 0 else len(head)])
                else:
                    length = 0
                self._close_after = b"\r\nconnection: close" in head
                self._need = end + 4 + length
            if len(buffer) < self._need:
                return
            del buffer[:self._need]
            self._need = -1
            self.busy = False
            status = self._status
            if self._close_after:
                self.closed = True
                assert self.transport is not None
                self.transport.close()
            self._on_done(self, status)
            if not buffer:
                return

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.busy:
            self.busy = False
            self._on_done(self, 0)
        self._on_lost(self)


class LoadGenerator:
    """Connections to one server, and the two ways of loading it (closed and open loop)."""

    def __init__(self, host: str, port: int, payload: bytes) -> None:
        self._host, self._port, self._payload = host, port, payload
        self._idle: deque[_Connection] = deque()
        self._open = 0
        self._waiting: deque[float] = deque()  # scheduled times of requests waiting for a conn
        self._inflight: dict[_Connection, tuple[float, float]] = {}
        self.outcomes: list[Outcome] = []
        self._limit = 1
        self._next: Callable[[], None] | None = None
        self._connecting = 0

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_connection(
                lambda: _Connection(self._done, self._lost), self._host, self._port)
        finally:
            self._connecting -= 1  # counted up in _refill, when the attempt was decided
        self._open += 1
        return protocol

    def _lost(self, connection: _Connection) -> None:
        self._open -= 1
        if connection in self._idle:
            self._idle.remove(connection)
        self._refill()

    def _done(self, connection: _Connection, status: int) -> None:
        scheduled, sent = self._inflight.pop(connection)
        self.outcomes.append(Outcome(status, scheduled, sent, time.perf_counter()))
        if not connection.closed:
            self._idle.append(connection)
        if self._next is not None:
            self._next()
        self._drain_waiting()

    def _issue(self, scheduled: float) -> None:
        """Send now on an idle connection, or queue until one is free (opening one if the pool
        is below its limit)."""
        if self._idle and not self._waiting:
            self._send(self._idle.popleft(), scheduled)
            return
        self._waiting.append(scheduled)
        self._refill()

    def _send(self, connection: _Connection, scheduled: float) -> None:
        self._inflight[connection] = (scheduled, time.perf_counter())
        connection.send(self._payload)

    def _drain_waiting(self) -> None:
        while self._waiting and self._idle:
            self._send(self._idle.popleft(), self._waiting.popleft())

    def _refill(self) -> None:
        missing = min(len(self._waiting), self._limit - self._open - self._connecting)
        for _ in range(max(missing, 0)):
            self._connecting += 1
            task = asyncio.get_running_loop().create_task(self._connect())
            task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[_Connection]) -> None:
        if task.cancelled() or task.exception() is not None:  # refused: fail one waiting
            if self._waiting:
                at = self._waiting.popleft()
                now = time.perf_counter()
                self.outcomes.append(Outcome(0, at, now, now))
            return
        self._idle.append(task.result())
        self._drain_waiting()

    def close(self) -> None:
        for connection in list(self._idle):
            if connection.transport is not None:
                connection.transport.close()
        self._idle.clear()

    async def closed_loop(self, concurrency: int, seconds: float) -> list[Outcome]:
        """``concurrency`` requests always outstanding, each on its own connection."""
        self._limit = concurrency
        self.outcomes = []
        stop_at = time.perf_counter() + seconds
        finished = asyncio.get_running_loop().create_future()

        def again() -> None:
            if time.perf_counter() < stop_at:
                self._issue(time.perf_counter())
            elif not self._inflight and not finished.done():
                finished.set_result(None)

        self._next = again
        for _ in range(concurrency):
            self._issue(time.perf_counter())
        await finished
        self._next = None
        return self.outcomes

    async def open_loop(self, rate: float, seconds: float, connections: int,
                        seed: int = 0) -> tuple[list[Outcome], float]:
        """Poisson arrivals at ``rate``/s through at most ``connections`` keep-alive
        connections; a request due while all are busy waits in the client (counted in its
        latency). Returns the outcomes and the rate actually issued."""
        self._limit = connections
        self.outcomes = []
        rng = random.Random(seed)
        start = time.perf_counter()
        at = 0.0
        issued = 0
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            scheduled = start + at
            delay = scheduled - time.perf_counter()
            if delay > 0.0005:  # sleep granularity: batch the sends due within 0.5 ms
                await asyncio.sleep(delay)
            self._issue(scheduled)
            issued += 1
        issued_rate = issued / (time.perf_counter() - start)
        deadline = time.perf_counter() + 60
        while (self._inflight or self._waiting) and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        return self.outcomes, issued_rate
