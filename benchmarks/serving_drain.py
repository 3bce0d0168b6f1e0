"""Count what clients get when ``gpufrag serve`` drains under load: answers vs resets.

A measurement, minutes long on a busy machine; run from the repository root:

    python -m benchmarks.serving_drain --connections new --runs 2
    python -m benchmarks.serving_drain --connections keep-alive --runs 2

It starts ``serve()`` with a fake model in a child process (the real process lifecycle and
signal handling), keeps ``--clients`` raw-socket HTTP/1.1 clients busy in a closed loop (each
sends its next request as soon as its last one ended), sends the child SIGTERM once
``--sigterm-after`` requests have been sent, and keeps the load on through the drain delay
until the listener has closed (every client has been refused a connection, or ``--total``
requests were sent). Each request ends as one of:

- ``200`` / ``503`` / other status: an answer;
- ``reset``: the connection was reset before the whole answer came (the defect the drain must
  not have: a request that reached the server and got no answer);
- ``eof``: the server closed the connection before any byte of an answer (an orderly close
  racing a request sent on an idle kept-alive connection; RFC 9112 section 9.3.1 lets a client
  retry it, since nothing came back);
- ``refused``: the listener was closed (the server has stopped; nothing was sent);
- ``connect_reset``: the connection was reset before the client could send (a handshake the
  kernel was completing as the listener closed; nothing was sent, so it is as safe to retry
  as a refusal). Counted apart from ``reset``, which lost a request.

``--connections new`` opens a connection for every request; ``keep-alive`` keeps one per client
and reconnects when an answer says ``Connection: close`` or the server closed it while idle (as
urllib3 checks a pooled connection before reusing it). ``--idle-clients`` adds connections
that carry one request before SIGTERM, idle, and carry a second one at a random moment around
the end of the drain delay, when the listener closes under this load (counted as ``idle:``;
``idle:closed_before_sent`` when the client saw the server's close first and sent nothing).
One JSON line per run on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import cast

from benchmarks import results
from gpufrag.loops import loop_factory
from serving.backends.select import LoadedBackend
from serving.config import BatcherConfig, ServerConfig
from serving.server import serve
from serving.testing import FakeBackend

BODY = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                               "data": [1, 2, 3, 4]}]}).encode()
REQUEST = (b"POST /v2/models/fake/infer HTTP/1.1\r\nHost: drain\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
           % (len(BODY), BODY))


def run_server(drain_delay_s: float, event_loop: str) -> None:
    """The child: ``serve()`` with a fake model on a free port, printed as ``PORT <n>``."""
    config = ServerConfig(model="fake", model_name="fake", host="127.0.0.1", port=0,
                          batcher=BatcherConfig(max_batch_size=32, max_queue_delay_s=0.001,
                                                max_queue_size=4096, default_timeout_s=30.0),
                          drain_delay_s=drain_delay_s, shutdown_timeout_s=20.0).validate()

    def listening(port: int) -> None:
        print(f"PORT {port}", flush=True)

    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        code = runner.run(serve(config, on_listening=listening,
                                load=lambda cfg, probe: LoadedBackend(FakeBackend(), 0.0)))
    sys.exit(code)


@dataclass
class Load:
    port: int
    keep_alive: bool
    total: int
    sigterm_after: int
    child: subprocess.Popen[bytes]
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    sigterm_at: float = 0.0
    last_answer_at: float = 0.0
    first_reset_at: float | None = None
    first_refused_at: float | None = None
    sigterm_sent: asyncio.Event = field(default_factory=asyncio.Event)


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """The status of one answer and whether it closes the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, v in
               (line.split(":", 1) for line in lines[1:] if ":" in line)}
    await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers.get("connection", "").lower() == "close"


async def client(load: Load) -> None:
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    while load.sent < load.total:
        if writer is not None and reader is not None and reader.at_eof():
            writer.close()  # closed by the server while idle: do not reuse it
            reader = writer = None
        if writer is None:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", load.port)
            except ConnectionRefusedError:
                load.outcomes["refused"] += 1
                load.first_refused_at = load.first_refused_at or time.monotonic()
                return  # the listener is closed: this client's server has stopped
            except ConnectionResetError:  # the handshake was reset: nothing was sent
                load.outcomes["connect_reset"] += 1
                return
        assert reader is not None
        load.sent += 1
        if load.sent >= load.sigterm_after and not load.sigterm_sent.is_set():
            load.sigterm_at = time.monotonic()
            load.child.send_signal(signal.SIGTERM)
            load.sigterm_sent.set()
        close = await exchange(load, reader, writer)
        if close or not load.keep_alive:
            writer.close()
            with contextlib.suppress(OSError):  # (ConnectionError is an OSError)
                await writer.wait_closed()
            reader = writer = None
    if writer is not None:
        writer.close()


async def exchange(load: Load, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   kind: str = "") -> bool:
    """Send one request and read its answer, counting the outcome under ``kind``; whether the
    connection is done."""
    try:
        writer.write(REQUEST)
        status, close = await read_answer(reader)
    except (ConnectionResetError, BrokenPipeError):
        load.outcomes[kind + "reset"] += 1
        load.first_reset_at = load.first_reset_at or time.monotonic()
        return True
    except asyncio.IncompleteReadError as exc:
        load.outcomes[kind + ("eof" if not exc.partial else "reset")] += 1
        return True
    load.outcomes[kind + str(status)] += 1
    load.last_answer_at = time.monotonic()
    return close


async def idle_client(load: Load, drain_delay_s: float, spread_s: float) -> None:
    """One request on a keep-alive connection before SIGTERM; then the connection idles until
    a random moment around the end of the drain delay (when the listener closes under this
    load), and a second request goes on it unless the server has closed it meanwhile (as a
    pooled client checks before reuse). Counted under ``idle:``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", load.port)
    load.sent += 1
    if await exchange(load, reader, writer, "idle-first:"):
        writer.close()
        return
    await load.sigterm_sent.wait()
    await asyncio.sleep(drain_delay_s + random.uniform(-spread_s / 2, spread_s))
    if reader.at_eof():
        load.outcomes["idle:closed_before_sent"] += 1
    else:
        load.sent += 1
        await exchange(load, reader, writer, "idle:")
    writer.close()


def start_child(drain_delay_s: float, event_loop: str) -> tuple[subprocess.Popen[bytes], int]:
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.serving_drain", "--serve",
         "--drain-delay-s", str(drain_delay_s), "--event-loop", event_loop],
        stdout=subprocess.PIPE)
    assert child.stdout is not None
    for raw in child.stdout:
        line = raw.decode().strip()
        if line.startswith("PORT "):
            # the child's log lines follow: read them away so its writes never block
            threading.Thread(target=child.stdout.read, daemon=True).start()
            return child, int(line.split()[1])
    raise RuntimeError(f"the server exited before listening (code {child.wait()})")


async def wait_ready(port: int) -> None:
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: drain\r\n\r\n"
    while True:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(ready)
            status, _ = await read_answer(reader)
            writer.close()
            if status == 200:
                return
        except ConnectionError:
            pass
        await asyncio.sleep(0.05)  # polling a child process's readiness, not a test


async def one_run(args: argparse.Namespace) -> dict[str, object]:
    child, port = start_child(args.drain_delay_s, args.server_loop)
    try:
        await wait_ready(port)
        load = Load(port, args.connections == "keep-alive", args.total, args.sigterm_after,
                    child)
        idle = [asyncio.create_task(idle_client(load, args.drain_delay_s, args.idle_spread_s))
                for _ in range(args.idle_clients)]
        started = time.monotonic()
        await asyncio.gather(*(client(load) for _ in range(args.clients)), *idle)
        code = await asyncio.get_running_loop().run_in_executor(None, child.wait, 60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    answered = sum(n for k, n in load.outcomes.items() if k.rsplit(":", 1)[-1].isdigit())
    return {"connections": args.connections, "server_loop": args.server_loop,
            "clients": args.clients, "sent": load.sent, "answered": answered,
            "outcomes": dict(sorted(load.outcomes.items())), "exit_code": code,
            "sigterm_s": round(load.sigterm_at - started, 2),
            "last_answer_s": round(load.last_answer_at - started, 2),
            "first_reset_s": (round(load.first_reset_at - started, 2)
                              if load.first_reset_at else None),
            "first_refused_s": (round(load.first_refused_at - started, 2)
                                if load.first_refused_at else None)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--connections", choices=["new", "keep-alive"], default="new")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--idle-clients", type=int, default=0,
                        help="also this many idle keep-alive connections, used again around "
                             "the end of the drain delay")
    parser.add_argument("--idle-spread-s", type=float, default=0.2)
    parser.add_argument("--total", type=int, default=20_000,
                        help="stop sending after this many, if the listener is still open")
    parser.add_argument("--sigterm-after", type=int, default=2_000)
    parser.add_argument("--drain-delay-s", type=float, default=0.7)
    parser.add_argument("--event-loop", "--server-loop", dest="server_loop",
                        choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--runs", type=int, default=1)
    results.add_arguments(parser, "serving_drain")
    args = parser.parse_args(argv)
    if args.serve:
        run_server(args.drain_delay_s, args.server_loop)
        return
    start = results.Start.now()
    figures: list[results.Figure] = []
    for number in range(1, args.runs + 1):
        with asyncio.Runner(loop_factory=loop_factory("uvloop")) as runner:
            run = runner.run(one_run(args))
        print(json.dumps(run), flush=True)
        outcomes = cast(dict[str, int], run["outcomes"])
        what = f"run {number}, {args.connections} connections, {args.clients} clients"
        figures += [
            results.Figure(f"{what}: requests sent", cast(int, run["sent"]), ""),
            results.Figure(f"{what}: answered", cast(int, run["answered"]), ""),
            # The defect a drain must not have: a request that reached the server, no answer.
            results.Figure(f"{what}: reset after sending (lost)",
                           sum(n for k, n in outcomes.items() if k.rsplit(":", 1)[-1] == "reset"),
                           "", results.Target("<=", 0))]
    results.record(args, "serving_drain", start, figures)


if __name__ == "__main__":
    main()
