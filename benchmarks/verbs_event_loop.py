"""A prototype for the benchmarks only: the extender's verbs on one event loop (uvloop, and
httptools for HTTP/1.1), the alternative to gunicorn's thread worker measured in
``benchmarks.wsgi_servers``.

Why measure it: in gunicorn's gthread worker every request passes from the main thread (its
poller) to a request thread and back, and in kube-scheduler's serial cycle those hand-offs,
each needing the GIL, are latency on every pod. Here the filter, prioritize and preempt verbs
run on the loop thread as the bytes arrive (their handler is the app's own, ``handle`` of
:func:`scheduler.extender.app.create_app`), and only the bind, which waits on the API server,
goes to a thread pool. One request per connection at a time (reading pauses until the answer
is written), which is how kube-scheduler calls.

It is NOT a server for production: it has none of what ``scheduler/extender/server.py`` adds
to gunicorn (the per-request deadline against slow clients, body limits before reading, TLS,
the probe listener, a graceful stop), so it answers the question "what would the hand-offs'
removal buy" and nothing more.

    python -m benchmarks.verbs_event_loop SNAPSHOT PORT [THREADS]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import signal
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, cast

import httptools
import uvloop

from gpufrag.errors import BadInput
from scheduler.extender.app import app_probes
from scheduler.extender.config import load_config
from scheduler.extender.runtime import freeze_heap, snapshot_runtime
from scheduler.kube.snapshot import read_snapshot

Handle = Callable[[str, Any, Mapping[str, Any]], tuple[int, bytes]]


def _answer(status: int, content_type: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
            % (status, HTTPStatus(status).phrase.encode(), content_type, len(body)) + body)


class _Connection(asyncio.Protocol):
    def __init__(self, verbs: Mapping[str, tuple[str, Any]], handle: Handle,
                 probes: Mapping[str, Callable[[], tuple[int, str, bytes]]],
                 pool: ThreadPoolExecutor, loop: asyncio.AbstractEventLoop) -> None:
        self.verbs, self.handle, self.probes, self.pool, self.loop = (verbs, handle, probes,
                                                                      pool, loop)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(400, b"text/plain", b"bad request\n")
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def _write(self, status: int, content_type: bytes, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_answer(status, content_type, body))

    def on_message_complete(self) -> None:
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        method = self.parser.get_method()
        if method == b"GET" and path in self.probes:
            status, content_type, out = self.probes[path]()
            self._write(status, content_type.encode(), out)
            return
        found = self.verbs.get(path) if method == b"POST" else None
        if found is None:
            self._write(404, b"application/json", b'{"Error": "not found"}')
            return
        body = b"".join(self.body)
        environ = {"CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        verb, work = found
        if verb != "bind":  # CPU only: answered here, on the loop thread
            status, out = self.handle(verb, work, environ)
            self._write(status, b"application/json", out)
            return
        assert self.transport is not None
        self.transport.pause_reading()  # one request at a time on a connection
        done = self.pool.submit(self.handle, verb, work, environ)
        done.add_done_callback(lambda f: self.loop.call_soon_threadsafe(self._bound, f))

    def _bound(self, done: Future[tuple[int, bytes]]) -> None:
        status, out = done.result()
        self._write(status, b"application/json", out)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", help="the cluster snapshot to serve")
    parser.add_argument("port", type=int)
    parser.add_argument("threads", type=int, nargs="?", default=8, help="bind threads")
    args = parser.parse_args(argv)
    snapshot, port, threads = args.snapshot, args.port, args.threads
    config = load_config(overrides=[("bind.enabled", "false"), ("hints.enabled", "false")])
    try:
        loaded = read_snapshot(snapshot)
    except BadInput as e:  # read_snapshot names the file and what is wrong with it
        parser.error(str(e))
    runtime = snapshot_runtime(loaded, config, on_ready=freeze_heap)
    sys.setswitchinterval(config.server.switch_interval_s)
    front = runtime.app.wsgi_app  # the app's verbs-first WSGI entry: its verbs and handler
    verbs, handle = front.verbs, front.handle  # type: ignore[attr-defined]
    probes = app_probes(runtime.app)
    pool = ThreadPoolExecutor(threads)
    runtime.start()
    uvloop.install()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(loop.create_server(
        lambda: _Connection(verbs, handle, probes, pool, loop), "127.0.0.1", port,
        reuse_address=True))
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    loop.add_signal_handler(signal.SIGINT, loop.stop)
    try:
        loop.run_forever()
    finally:
        server.close()
        runtime.stop()
        pool.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
