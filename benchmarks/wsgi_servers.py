"""Why the extender is served by uvicorn: its Flask app on the candidate servers, side by side
on the same snapshot, for kube-scheduler's traffic (many short POSTs, about half on a
new connection: kube-scheduler keeps only two idle connections to an extender) and for slow
clients.

    python -m benchmarks.wsgi_servers [--size 1000] [--requests 400] [--clients 4]

For each server: sequential filter latency on one keep-alive connection, the same with a new
connection per request, requests/s with several client processes that open a new connection
for every other request, how long a ``GET /readyz`` waits while twice as many clients as the
server has threads each hold a half-sent body or half-sent headers (the slow-client case: a
server that gives each request a thread while its body arrives stalls here until the bodies
time out), and how many of those stalled requests are still held 2 s past the extender's read
deadline (neither answered nor cut: each a connection, or a thread, kept). The app,
its state and the request bodies are the same; only the server differs. ``gpufrag`` is the
product (``gpufrag extender``: uvicorn on httptools, through :mod:`gpufrag.httpserve`, behind
its gateway and connection door). The others are measured here only, when installed, and
their rows left out otherwise: the same gateway (bodies read within their deadline, then the
WSGI app) on Hypercorn, the server gpufrag used before (``hypercorn``), and on granian's ASGI
(``granian-asgi``); and the WSGI app straight on gunicorn (gthread) and granian (WSGI).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import multiprocessing
import os
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks import results
from benchmarks.extender_latency import (
    build_cluster,
    call,
    free_port,
    ms,
    request_bodies,
    sequential,
    start_server,
    stop_server,
    wait_ready,
)
from gpufrag.httpserve import Gateway
from gpufrag.loops import new_event_loop
from scheduler.extender.app import inline_verbs
from scheduler.extender.config import load_config
from scheduler.extender.runtime import snapshot_runtime
from scheduler.extender.server import limits
from scheduler.kube.snapshot import read_snapshot

SNAPSHOT_ENV = "GPUFRAG_BENCH_SNAPSHOT"
# Issue 47: a probe answered within this while slow clients stall, and none of theirs held
# past the extender's read deadline (server.read_timeout_s' default).
PROBE_TARGET_MS = 100.0
READ_DEADLINE_S = 5.0


def granian_app() -> object:
    """The extender's app over the snapshot named by ``GPUFRAG_BENCH_SNAPSHOT`` (granian's
    ``--factory`` target): what ``gpufrag extender --cluster-snapshot`` serves, without bind."""
    config = load_config(overrides=[("bind.enabled", "false"), ("hints.enabled", "false")])
    runtime = snapshot_runtime(read_snapshot(os.environ[SNAPSHOT_ENV]), config)
    runtime.start()
    return runtime.app


def gateway_app() -> Gateway:
    """The same app behind the same gateway as ``gpufrag extender`` serves it (the verbs'
    limits, filter and prioritize answered inline), for a reference ASGI server to run
    (granian's ``--factory`` target, and Hypercorn's below)."""
    config = load_config(overrides=[("bind.enabled", "false"), ("hints.enabled", "false")])
    runtime = snapshot_runtime(read_snapshot(os.environ[SNAPSHOT_ENV]), config)
    runtime.start()
    server = config.server
    return Gateway(runtime.app, limits(server),
                   ThreadPoolExecutor(server.threads, thread_name_prefix="verbs"),
                   inline=inline_verbs(server.url_prefix))


def serve_hypercorn(port: int) -> None:
    """Serve :func:`gateway_app` on Hypercorn (``--serve-hypercorn PORT``), the extender's
    settings as they were when it served them."""
    from hypercorn.asyncio import serve  # measured only where installed
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_timeout = 75.0
    config.include_server_header = False
    config.accesslog = None
    app = gateway_app()
    loop = new_event_loop(choice="auto")
    # (Hypercorn's ASGI type and the gateway's signature differ only in their annotations.)
    loop.run_until_complete(serve(cast(Any, app), config, mode="asgi"))


def start_hypercorn(snapshot: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "benchmarks.wsgi_servers", "--serve-hypercorn", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ,
                                                           SNAPSHOT_ENV: str(snapshot)})
    return wait_ready(server, port, 600, "hypercorn")


def start_granian_asgi(snapshot: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--no-access-log", "--log-level", "warning", "--loop", "uvloop",
               "benchmarks.wsgi_servers:gateway_app"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ,
                                                           SNAPSHOT_ENV: str(snapshot)})
    return wait_ready(server, port, 600, "granian (ASGI)")


def start_gunicorn(snapshot: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1",
               "--threads", str(threads), "--bind", f"127.0.0.1:{port}", "--keep-alive", "75",
               "--log-level", "warning", "benchmarks.wsgi_servers:granian_app()"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ,
                                                           SNAPSHOT_ENV: str(snapshot)})
    return wait_ready(server, port, 600, "gunicorn")


def probe_while_stalled(port: int, stalled: int, deadline_s: float,
                        timeout_s: float = 10.0) -> tuple[float, int]:
    """Seconds a ``GET /readyz`` takes while ``stalled`` clients each hold half a request
    (``timeout_s`` when it got no answer in that time): half of them half a body, half of them
    half their headers. Then how many of those requests are still held, neither answered nor
    cut, 2 s past ``deadline_s`` (the extender's ``server.read_timeout_s``) from their start:
    each held one is a connection, and on a thread-per-request server a thread, kept past
    the deadline."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(stalled)]
    opened = time.monotonic()
    try:
        for i, sock in enumerate(socks):
            sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
                         if i % 2 == 0 else b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le")
        # A plain request on a fresh connection, after every stalled one has been accepted.
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        try:
            conn.request("GET", "/readyz")
            conn.getresponse().read()
            waited = time.perf_counter() - started
        except OSError:
            waited = timeout_s
        finally:
            conn.close()
        return waited, held_past(socks, opened + deadline_s + 2.0)
    finally:
        for sock in socks:
            sock.close()


def held_past(socks: list[socket.socket], until: float) -> int:
    """How many of ``socks`` the server has neither answered nor closed by ``until``
    (monotonic): each is read as it becomes readable, nothing else is sent."""
    held = set(range(len(socks)))
    watched = selectors.DefaultSelector()
    for i, sock in enumerate(socks):
        sock.setblocking(False)
        watched.register(sock, selectors.EVENT_READ, i)
    try:
        while held and (left := until - time.monotonic()) > 0:
            for key, _ in watched.select(timeout=left):
                held.discard(key.data)  # an answer's first bytes, or the close
                watched.unregister(key.fileobj)
    finally:
        watched.close()
    return len(held)


def start_granian(snapshot: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "granian", "--interface", "wsgi", "--factory",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
               "--blocking-threads", str(threads), "--no-access-log", "--log-level", "warning",
               "benchmarks.wsgi_servers:granian_app"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, env={**os.environ,
                                                           SNAPSHOT_ENV: str(snapshot)})
    return wait_ready(server, port, 600, "granian")


def fresh_connections(port: int, bodies: list[bytes], count: int) -> np.ndarray:
    """Sequential filters, each on a new connection (connect time included)."""
    times = []
    for i in range(count):
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        call(conn, "/filter", bodies[i % len(bodies)])
        conn.close()
        times.append(time.perf_counter() - started)
    return np.array(times)


def _client(port: int, bodies: list[bytes], duration_s: float, start_at: float,
            queue: multiprocessing.Queue[int]) -> None:
    while time.time() < start_at:
        time.sleep(0.001)
    end, done = time.time() + duration_s, 0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    while time.time() < end:
        if done % 2:  # every other request on a new connection, as kube-scheduler's pool
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        call(conn, "/filter", bodies[done % len(bodies)])
        done += 1
    conn.close()
    queue.put(done)


def saturation(port: int, bodies: list[bytes], clients: int, duration_s: float) -> float:
    queue: multiprocessing.Queue[int] = multiprocessing.Queue()
    start_at = time.time() + 1.0
    procs = [multiprocessing.Process(target=_client, args=(port, bodies, duration_s, start_at,
                                                           queue)) for _ in range(clients)]
    for p in procs:
        p.start()
    total = sum(queue.get() for _ in procs)
    for p in procs:
        p.join()
    return total / duration_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve-hypercorn", type=int, metavar="PORT", help=argparse.SUPPRESS)
    results.add_arguments(parser, "wsgi_servers")
    args = parser.parse_args(argv)
    if args.serve_hypercorn is not None:
        serve_hypercorn(args.serve_hypercorn)
        return 0
    start = results.Start.now()
    modules = {"hypercorn": "hypercorn", "granian-asgi": "granian", "gunicorn": "gunicorn",
               "granian": "granian"}
    servers = ["gpufrag", *modules]
    for name, module in modules.items():
        if importlib.util.find_spec(module) is None:
            print(f"wsgi_servers: {module} is not installed (pip install {module}; it is "
                  "measured here only, not a dependency of gpufrag): its row is left out",
                  file=sys.stderr)
            servers.remove(name)
    starters = {"hypercorn": start_hypercorn, "granian-asgi": start_granian_asgi,
                "gunicorn": start_gunicorn, "granian": start_granian}
    measured = {}
    with tempfile.TemporaryDirectory(prefix="gpufrag-bench-") as folder:
        cluster = build_cluster(args.size, 0.75, args.seed, Path(folder))
        for name in servers:
            port = free_port()
            server = (starters[name](cluster.snapshot, port, args.threads) if name in starters
                      else start_server(cluster.snapshot, port, args.threads, "info", "decide"))
            try:
                bodies = request_bodies(cluster, port, args.seed + 7)[0]
                kept = sequential(port, "/filter", bodies, args.requests)
                fresh = fresh_connections(port, bodies, args.requests)
                rps = saturation(port, bodies, args.clients, args.duration_s)
                probe_s, held = probe_while_stalled(port, 2 * args.threads, READ_DEADLINE_S)
            finally:
                stop_server(server)
            measured[name] = (kept, fresh, rps, probe_s, held)
    print(f"the extender's app, {args.size} nodes, filter (decide), {os.cpu_count()} CPUs, "
          f"{args.threads} threads, log level info:")
    print(f"  {'server':<12} {'keep-alive p50/p99 ms':>22} {'new conn. p50/p99 ms':>21} "
          f"{'req/s (4 clients, half new conn.)':>34}  {'probe, stalled':>14}  "
          f"{'held past deadline':>18}")
    figures: list[results.Figure] = []
    for name, (kept, fresh, rps, probe_s, held) in measured.items():
        print(f"  {name:<12} {ms(kept, 50):>10.2f} / {ms(kept, 99):<9.2f} "
              f"{ms(fresh, 50):>9.2f} / {ms(fresh, 99):<9.2f} {rps:>20.0f} "
              f"({rps / measured['gpufrag'][2]:.2f} x gpufrag) {probe_s * 1000:>11.0f} ms  "
              f"{held:>6} of {2 * args.threads}")
        figures += [
            results.Figure(f"{name}: keep-alive p50", round(ms(kept, 50), 2), "ms"),
            results.Figure(f"{name}: keep-alive p99", round(ms(kept, 99), 2), "ms"),
            results.Figure(f"{name}: new connection p99", round(ms(fresh, 99), 2), "ms"),
            results.Figure(f"{name}: requests/s, {args.clients} clients", round(rps), "req/s"),
            # The product must answer a probe while slow clients hold connections; the other
            # servers are measured beside it, not judged.
            results.Figure(f"{name}: a probe while {2 * args.threads} clients hold half-sent "
                           "bodies and headers", round(probe_s * 1000, 1), "ms",
                           results.Target("<=", PROBE_TARGET_MS) if name == "gpufrag" else None),
            results.Figure(f"{name}: of those {2 * args.threads}, still held 2 s past the "
                           f"{READ_DEADLINE_S:g} s read deadline", held, "",
                           results.Target("<=", 0) if name == "gpufrag" else None)]
    results.record(args, "wsgi_servers", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
