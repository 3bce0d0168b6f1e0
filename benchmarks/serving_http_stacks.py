"""What the HTTP layer alone costs per request: the candidate stacks for ``gpufrag serve``'s
front end, each answering the infer POST with a fixed binary v2 response and no model.

Why: with a model that computes an image in ~0.1 ms of CPU (``builtin:resnet-small``), the
server's event loop spends more per request than the model does, so the question is how much of
that is the HTTP stack itself (parse, dispatch, response headers, socket write) and how much a
leaner stack would save. Stacks measured, each in its own process, on uvloop and on asyncio's
loop:

- ``aiohttp-app``: an ``aiohttp.web.Application`` with a router, as ``serving/app.py`` used it
  before the front end was rewritten (without its middlewares and metrics: the stack only);
- ``aiohttp-lowlevel``: aiohttp's low-level ``web.Server`` (one handler, no router);
- ``httptools``: ``asyncio.Protocol`` + httptools' parser (the parser uvicorn uses), the
  response written as bytes: roughly the floor for an HTTP/1.1 server in Python;
- ``uvicorn``: a bare ASGI app (read the body, send the answer) on uvicorn with httptools, the
  server every other gpufrag listener runs on (gpufrag/httpserve.py): what serve's front end
  would cost on it before any of serve's own work;
- ``gpufrag-serve``: not a bare stack but the whole server without a model: the real front end
  (``serving/frontend.py``), routes, v2 parsing and checks, the batcher (max batch 32, no queue
  delay), response encoding and metrics, over a backend that answers zeros at no cost. Its CPU
  per request is what ``gpufrag serve`` adds to a model's own compute.

And, for ``gpufrag-serve`` alone, its own code without the kernel's part: the same requests
fed in process to 64 of its connections (``serving.http1.Connection``) whose transport only
counts answers, the event loop thread's CPU per request. The whole-server figure swings with
how busy the shared machine keeps it (an idle server wakes per request and per batch, and
its batches shrink); this one shows what the front end itself costs.

Each is driven by ``benchmarks/serving_load.py`` (one thread) with 64 keep-alive connections;
three interleaved runs per stack, median of the server's CPU per request. Usage::

    python -m benchmarks.serving_http_stacks            # ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
import uvicorn
from aiohttp import web

from benchmarks import results
from benchmarks.procstat import cpu_seconds
from benchmarks.serving_load import LoadGenerator, raw_request
from gpufrag.loops import loop_factory, new_event_loop
from serving.app import ServerState
from serving.backends.base import Array
from serving.batcher import DynamicBatcher
from serving.client import encode_inputs
from serving.config import BatcherConfig
from serving.frontend import front_end
from serving.http1 import Connection, HttpServer
from serving.metrics import ServingMetrics
from serving.protocol import ModelInfo
from serving.tensors import TensorSpec

STACKS = ("aiohttp-app", "aiohttp-lowlevel", "httptools", "uvicorn", "gpufrag-serve")
LOOPS = ("uvloop", "asyncio")
# Issue 47: what gpufrag serve may add per request to a model's own compute, in CPU.
SERVE_TARGET_US = 60.0
HEADER = b'{"model_name":"m","model_version":"1","outputs":[{"name":"logits","datatype":"FP32",' \
         b'"shape":[1,10],"parameters":{"binary_data_size":40}}]}'
ANSWER = HEADER + bytes(40)


async def _serve_aiohttp(port: int, lowlevel: bool) -> None:
    async def infer(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/octet-stream",
                            headers={"Inference-Header-Content-Length": str(len(HEADER))})

    if lowlevel:
        server = web.Server(infer, access_log=None, handler_cancellation=True)
        await asyncio.get_running_loop().create_server(server, "127.0.0.1", port)
    else:
        app = web.Application()
        app.router.add_post("/v2/models/{name}/infer", infer)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _serve_httptools(port: int) -> None:
    import httptools  # a dev dependency: only this stack needs it

    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Inference-Header-Content-Length: " + str(len(HEADER)).encode() +
            b"\r\nContent-Length: " + str(len(ANSWER)).encode() + b"\r\n\r\n")

    class Connection(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body: list[bytes] = []

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_body(self, body: bytes) -> None:
            self.body.append(body)

        def on_message_complete(self) -> None:
            b"".join(self.body)
            self.body = []
            self.transport.write(head + ANSWER)

    await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", port)
    await asyncio.Event().wait()


async def _serve_uvicorn(port: int) -> None:
    headers = [(b"content-type", b"application/octet-stream"),
               (b"inference-header-content-length", str(len(HEADER)).encode()),
               (b"content-length", str(len(ANSWER)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": ANSWER})

    config = uvicorn.Config(app, host="127.0.0.1", port=port, http="httptools", ws="none",
                            lifespan="off", interface="asgi3", loop="none", log_config=None,
                            access_log=False, server_header=False, date_header=False)
    await uvicorn.Server(config).serve()


class ZeroCostBackend:
    """resnet-small's inputs and outputs, answered with zeros: the server without a model."""

    kind = "zero-cost"
    inputs = (TensorSpec("input", "FP32", (-1, 3, 32, 32)),)
    outputs = (TensorSpec("logits", "FP32", (-1, 10)),)
    static_batch_size: int | None = None
    max_batch_size: int | None = None

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return {"logits": np.zeros((len(inputs["input"]), 10), dtype=np.float32)}

    def close(self) -> None:
        pass


def _gpufrag_front_end() -> HttpServer:
    """gpufrag serve without a model, its batcher started on the running loop."""
    backend = ZeroCostBackend()
    config = BatcherConfig(max_batch_size=32, max_queue_delay_s=0.0)
    state = ServerState(model_name="m", metrics=ServingMetrics(model="m"),
                        max_body_bytes=1 << 20)
    batcher = DynamicBatcher(backend, config, observer=state.metrics)
    batcher.start()
    state.batcher = batcher
    state.model = ModelInfo(name="m", platform=backend.kind, inputs=backend.inputs,
                            outputs=backend.outputs, max_batch_size=config.max_batch_size)
    state.set_ready(True)
    return front_end(state)


async def _serve_gpufrag(port: int) -> None:
    await _gpufrag_front_end().start("127.0.0.1", port)
    await asyncio.Event().wait()


class _CountingTransport:
    """A connection's transport that keeps nothing: counts the answers written to it."""

    def __init__(self, answered: Callable[[], None]) -> None:
        self._answered = answered

    def write(self, data: bytes) -> None:
        self._answered()

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def _in_process(payload: bytes, connections: int, rounds: int, repeats: int) -> float:
    """The event loop thread's CPU per request of gpufrag serve's own code, without sockets:
    ``connections`` connections (serving.http1.Connection on a transport that only counts
    answers) are each fed one request per round, and the round ends when every answer is
    written; the median over ``repeats`` of ``rounds`` rounds, in microseconds. What it leaves
    out is the kernel's part (reads, writes, epoll) and the batch's compute thread."""
    server = _gpufrag_front_end()
    waiting = 0
    all_answered = asyncio.Event()

    def answered() -> None:
        nonlocal waiting
        waiting -= 1
        if not waiting:
            all_answered.set()

    peers = []
    for _ in range(connections):
        peer = Connection(server)
        peer.connection_made(cast(asyncio.Transport, _CountingTransport(answered)))
        peers.append(peer)

    async def one_round() -> None:
        nonlocal waiting
        all_answered.clear()
        waiting = connections
        for peer in peers:
            peer.data_received(payload)
        await all_answered.wait()

    for _ in range(rounds):  # warm: request plans, the executor's thread
        await one_round()
    runs = []
    for _ in range(repeats):
        started = time.thread_time()
        for _ in range(rounds):
            await one_round()
        runs.append(1e6 * (time.thread_time() - started) / (rounds * connections))
    return float(np.median(runs))


def in_process(payload: bytes, loop: str) -> float:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(_in_process(payload, connections=64, rounds=40, repeats=9))


def serve(stack: str, loop: str, port: int) -> None:
    main = (_serve_httptools(port) if stack == "httptools"
            else _serve_uvicorn(port) if stack == "uvicorn"
            else _serve_gpufrag(port) if stack == "gpufrag-serve"
            else _serve_aiohttp(port, lowlevel=stack == "aiohttp-lowlevel"))
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(main)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"stack on port {port} did not start")


def measure(process: subprocess.Popen[bytes], port: int, payload: bytes,
            seconds: float) -> tuple[float, float]:
    """(requests/s, server CPU microseconds per request) over one closed-loop run."""

    async def phase() -> tuple[float, float]:
        generator = LoadGenerator("127.0.0.1", port, payload)
        try:
            await generator.closed_loop(8, 0.2)
            before = cpu_seconds(process.pid)
            started = time.perf_counter()
            outcomes = await generator.closed_loop(64, seconds)
            elapsed = time.perf_counter() - started
            done = max(1, sum(1 for o in outcomes if o.status == 200))
            return done / elapsed, 1e6 * (cpu_seconds(process.pid) - before) / done
        finally:
            generator.close()

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(phase())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per run")
    parser.add_argument("--serve", nargs=3, metavar=("STACK", "LOOP", "PORT"),
                        help=argparse.SUPPRESS)  # the child process's entry
    results.add_arguments(parser, "serving_http_stacks")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve[0], args.serve[1], int(args.serve[2]))
        return 0
    start = results.Start.now()
    image = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    request = encode_inputs({"input": image}, binary=True)
    payload = raw_request("127.0.0.1", "/v2/models/m/infer", request.body, request.headers())
    children: dict[tuple[str, str], tuple[subprocess.Popen[bytes], int]] = {}
    try:
        for stack in STACKS:
            for loop in LOOPS:
                port = _free_port()
                command = [sys.executable, "-m", "benchmarks.serving_http_stacks", "--serve",
                           stack, loop, str(port)]
                children[stack, loop] = (subprocess.Popen(command, start_new_session=True),
                                         port)
        for _, port in children.values():
            _wait_listening(port)
        measured: dict[tuple[str, str], list[tuple[float, float]]] = {k: [] for k in children}
        for _ in range(3):
            for key, (process, port) in children.items():
                measured[key].append(measure(process, port, payload, args.seconds))
    finally:
        for process, _ in children.values():
            process.terminate()
            process.wait()
    print(f"HTTP stack alone: binary infer POST ({len(request.body)} B) -> fixed binary answer, "
          "64 keep-alive connections, median of 3 interleaved runs")
    header = f"{'stack':>16} | {'loop':>7} | {'req/s':>7} | {'server CPU us/req':>17} | runs us"
    print(header)
    print("-" * len(header))
    figures: list[results.Figure] = []
    for (stack, loop), runs in measured.items():
        rate = float(np.median([r for r, _ in runs]))
        cpu = float(np.median([c for _, c in runs]))
        print(f"{stack:>16} | {loop:>7} | {rate:>7.0f} | {cpu:>17.1f} | "
              + "/".join(f"{c:.0f}" for _, c in runs))
        # A comparison of stacks; the one target is serve's own cost on its default loop
        # (issue 47): what it adds to a model's compute.
        target = (results.Target("<=", SERVE_TARGET_US)
                  if (stack, loop) == ("gpufrag-serve", "uvloop") else None)
        figures += [results.Figure(f"{stack} on {loop}: server CPU per request", round(cpu, 1),
                                   "µs", target),
                    results.Figure(f"{stack} on {loop}: requests/s", round(rate), "req/s")]
    print("gpufrag-serve's own code in process, without sockets: event loop thread CPU per "
          "request, 64 connections, median of 9 runs")
    for loop in LOOPS:
        own_us = in_process(payload, loop)
        print(f"{'gpufrag-serve':>16} | {loop:>7} | {own_us:.1f} us")
        figures.append(results.Figure(f"gpufrag-serve on {loop}, in process without sockets: "
                                      "event loop thread CPU per request", round(own_us, 1),
                                      "µs"))
    results.record(args, "serving_http_stacks", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
