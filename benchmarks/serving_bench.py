"""Serving benchmark: what dynamic batching buys, measured side by side in one run.

For each model (default ``builtin:resnet-medium``, a ResNet-18 on 64x64 whose compute outweighs
a request's HTTP cost on a CPU, then ``builtin:resnet-small``, whose compute does not) and each
max batch size (1, 8, 16, 32) it starts ``gpufrag serve`` as a subprocess and drives it over
HTTP with an asyncio load generator:

1. **Saturation** — a closed loop with enough concurrent requests to keep batches full
   (2 x max batch, at least 16): completed requests per second, and the CPU the server and the
   load generator spent per request.
2. **70% of saturation** — an *open-loop* Poisson arrival process (arrivals do not wait for
   responses, as real users do not), latency measured from each request's *scheduled* send time
   so a stalled server cannot hide queueing (no coordinated omission): p50 / p99, and the mean
   batch size read from the server's own ``gpufrag_serving_batch_size`` histogram.
3. **Direct** — the same model through the same backend class (same thread settings), called
   in-process with no server, at that batch size: images per second, measured half before and
   half after the server's phases. ``server/direct`` is saturation throughput over that.

Requests use the v2 **binary tensor data extension** by default (raw float32 bytes after a JSON
header, outputs asked for as binary too); ``--protocol json`` switches every phase to JSON
tensors. Either way the saturation phase alternates binary and JSON closed-loop runs, so the
table shows what text tensors cost, measured under the same background load.

Then a **2x overload** run at the largest batch size: twice the measured saturation, offered
through a pool of keep-alive connections, a queue bound of 2 batches and a per-request deadline
(by default max(250 ms, 4 x the direct full-batch time), the Little's-law sizing the docs give:
2 batches queued + 1 computing + 1 own fit in 4 batch times). Reported: how fast rejections
(503) come back, p50 and p99 at the client, and how many admitted requests were answered
within their deadline (200s late or 504s count against it).

Each figure is printed next to its target (server/direct >= 0.9; p99 at 70% load <= max queue
delay + 2 x full-batch compute time; rejections < 5 ms; accepted within the deadline), with
how far off it is when missed. The load generator shares the machine with the server; on a
small CPU box both compete for the same cores, which the figures include. Usage::

    python -m benchmarks.serving_bench                 # ~4 minutes, both models
    python -m benchmarks.serving_bench --models builtin:resnet-medium --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from benchmarks.procstat import cpu_seconds
from serving.backends.onnx_runtime import OnnxRuntimeBackend
from serving.client import EncodedRequest, encode_inputs
from serving.models import materialize, model_name


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    log_tail: list[str] = field(default_factory=list)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(model: str, cache: Path, *, max_batch: int, delay_ms: float,
                 queue_size: int, timeout_ms: float) -> Server:
    env = {**os.environ, "GPUFRAG_CACHE_DIR": str(cache), "GPUFRAG_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "gpufrag.cli", "serve", "--model", model,
               "--host", "127.0.0.1", "--port", "0", "--max-batch-size", str(max_batch),
               "--max-queue-delay-ms", str(delay_ms), "--max-queue-size", str(queue_size),
               "--default-timeout-ms", str(timeout_ms)]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    port = None
    tail: list[str] = []
    for line in process.stderr:
        tail.append(line)
        entry = json.loads(line)
        if entry.get("event") == "listening":
            port = entry["port"]
        if entry.get("event") == "ready":
            break
    if port is None or process.poll() is not None:
        raise RuntimeError("server did not start:\n" + "".join(tail[-20:]))
    server = Server(process, f"http://127.0.0.1:{port}", tail)

    def drain() -> None:  # keep reading so the server never blocks on a full pipe
        assert process.stderr is not None
        for line in process.stderr:
            server.log_tail = [*server.log_tail[-50:], line]

    threading.Thread(target=drain, daemon=True).start()
    return server


def request_body(image_size: int, *, binary: bool) -> EncodedRequest:
    """One image, encoded as the client library encodes it (binary: outputs binary too)."""
    image = np.random.default_rng(0).random((1, 3, image_size, image_size), dtype=np.float32)
    return encode_inputs({"input": image}, binary=binary)


SCRAPED = ("gpufrag_serving_batch_size_sum", "gpufrag_serving_batch_size_count",
           "gpufrag_serving_compute_duration_seconds_sum")


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The server's own counters named in SCRAPED (summed over labels)."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    totals = dict.fromkeys(SCRAPED, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


@dataclass
class ServerStats:
    """What the server's histograms say about one phase."""

    batches: float
    rows: float
    compute_s: float

    @property
    def mean_batch(self) -> float:
        return self.rows / self.batches if self.batches else math.nan

    @property
    def compute_ms_per_batch(self) -> float:
        return 1000 * self.compute_s / self.batches if self.batches else math.nan


@dataclass
class Outcome:
    status: int
    latency_s: float  # from the scheduled send time: what the user sees
    server_s: float  # from the request's headers leaving the client: the server's response time


def _timed_session(connections: int) -> aiohttp.ClientSession:
    """A session that stamps when each request's headers were written (after any wait for a
    connection), so server response time can be told apart from client-side queueing."""
    trace = aiohttp.TraceConfig()

    async def headers_sent(session: aiohttp.ClientSession, context: Any, params: Any) -> None:
        if isinstance(context.trace_request_ctx, dict):  # None for the /metrics scrapes
            context.trace_request_ctx["sent"] = time.perf_counter()

    trace.on_request_headers_sent.append(headers_sent)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                 trace_configs=[trace])


async def send(session: aiohttp.ClientSession, url: str, body: bytes,
               headers: dict[str, str], scheduled: float) -> Outcome:
    stamps: dict[str, float] = {}
    try:
        async with session.post(url, data=body, headers=headers,
                                trace_request_ctx=stamps) as response:
            await response.read()
            status = response.status
    except aiohttp.ClientError:
        status = 0
    done = time.perf_counter()
    return Outcome(status, done - scheduled, done - stamps.get("sent", scheduled))


async def closed_loop(url: str, model: str, request: EncodedRequest, *, concurrency: int,
                      seconds: float) -> float:
    """Requests per second with ``concurrency`` requests always outstanding."""
    infer = f"{url}/v2/models/{model}/infer"
    headers = request.headers()
    body = request.body
    async with _timed_session(0) as session:
        for _ in range(3):  # warm the connection pool and the model
            await send(session, infer, body, headers, time.perf_counter())
        done = 0
        stop_at = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                outcome = await send(session, infer, body, headers, time.perf_counter())
                if outcome.status == 200:
                    done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def open_loop(url: str, model: str, request: EncodedRequest, *, rate: float,
                    seconds: float, timeout_ms: float | None = None, seed: int = 0,
                    connections: int = 0) -> tuple[list[Outcome], float, ServerStats]:
    """Poisson arrivals at ``rate``/s; returns outcomes, achieved send rate, and what the
    server's histograms gained over the run. ``connections`` bounds the client's keep-alive
    pool (0 = a new connection whenever none is idle), as a proxy fleet would."""
    rng = random.Random(seed)
    infer = f"{url}/v2/models/{model}/infer"
    headers = request.headers()
    body = request.body
    if timeout_ms is not None:
        headers["Timeout-Ms"] = str(int(timeout_ms))
    async with _timed_session(connections) as session:
        before = await scrape(session, url)
        tasks: list[asyncio.Task[Outcome]] = []
        start = time.perf_counter()
        at = 0.0
        while True:
            at += rng.expovariate(rate)
            if at >= seconds:
                break
            scheduled = start + at
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(session, infer, body, headers, scheduled)))
        sent_rate = len(tasks) / (time.perf_counter() - start)
        outcomes = list(await asyncio.gather(*tasks))
        after = await scrape(session, url)
    gained = {name: after[name] - before[name] for name in SCRAPED}
    stats = ServerStats(batches=gained["gpufrag_serving_batch_size_count"],
                        rows=gained["gpufrag_serving_batch_size_sum"],
                        compute_s=gained["gpufrag_serving_compute_duration_seconds_sum"])
    return outcomes, sent_rate, stats


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


def direct_throughput(path: Path, image_size: int, batch: int, seconds: float) -> float:
    """Images per second through the backend in-process, no HTTP, no batcher (same ORT
    settings as the server: all cores but one)."""
    backend = OnnxRuntimeBackend(path)
    x = np.random.default_rng(0).random((batch, 3, image_size, image_size), dtype=np.float32)
    for _ in range(2):
        backend.infer({"input": x})
    runs = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or runs < 2:
        backend.infer({"input": x})
        runs += 1
    rate = runs * batch / (time.perf_counter() - started)
    backend.close()
    return rate


@dataclass
class SizeResult:
    """Everything measured at one max batch size."""

    size: int
    direct: float  # images/s, the mean of a measurement before and one after the server's
    runs: dict[str, list[float]]  # protocol -> saturation req/s of each closed-loop run
    server_cpu_ms: dict[str, float]  # protocol -> server CPU per completed request
    client_cpu_ms: dict[str, float]  # protocol -> load generator CPU per completed request
    rate: float = 0.0
    sent: float = 0.0
    p50: float = math.nan
    p99: float = math.nan
    failed: int = 0
    mean_batch: float = math.nan

    def saturation(self, protocol: str) -> float:
        return float(np.median(self.runs[protocol]))

    @property
    def batch_ms(self) -> float:
        """Time to compute one full batch directly."""
        return 1000 * self.size / self.direct


def measure_size(model: str, name: str, path: Path, cache: Path, image_size: int, size: int,
                 requests: dict[str, EncodedRequest], args: argparse.Namespace) -> SizeResult:
    direct_before = direct_throughput(path, image_size, size, args.direct_seconds / 2)
    server = start_server(model, cache, max_batch=size, delay_ms=args.delay_ms,
                          queue_size=4096, timeout_ms=30_000)
    concurrency = max(16, 2 * size)
    result = SizeResult(size, math.nan, {p: [] for p in requests},
                        dict.fromkeys(requests, 0.0), dict.fromkeys(requests, 0.0))
    server_cpu: dict[str, list[float]] = {p: [] for p in requests}
    client_cpu: dict[str, list[float]] = {p: [] for p in requests}
    try:
        # Saturation: three closed-loop runs per protocol, alternating, so background load on
        # a shared machine falls on both; the median is reported.
        for _ in range(3):
            for protocol, request in requests.items():
                server0, client0 = cpu_seconds(server.process.pid), time.process_time()
                rate = asyncio.run(closed_loop(server.url, name, request,
                                               concurrency=concurrency,
                                               seconds=args.seconds / 3))
                done = max(1.0, rate * args.seconds / 3)
                result.runs[protocol].append(rate)
                server_cpu[protocol].append((cpu_seconds(server.process.pid) - server0) / done)
                client_cpu[protocol].append((time.process_time() - client0) / done)
        for protocol in requests:
            result.server_cpu_ms[protocol] = 1000 * float(np.median(server_cpu[protocol]))
            result.client_cpu_ms[protocol] = 1000 * float(np.median(client_cpu[protocol]))
        primary = args.protocol
        result.rate = 0.7 * result.saturation(primary)
        outcomes, result.sent, stats = asyncio.run(open_loop(
            server.url, name, requests[primary], rate=result.rate, seconds=args.seconds,
            connections=2 * concurrency))
    finally:
        server.stop()
    ok = [o.latency_s for o in outcomes if o.status == 200]
    result.p50, result.p99 = percentile_ms(ok, 50), percentile_ms(ok, 99)
    result.failed = len(outcomes) - len(ok)
    result.mean_batch = stats.mean_batch
    direct_after = direct_throughput(path, image_size, size, args.direct_seconds / 2)
    result.direct = (direct_before + direct_after) / 2
    return result


def verdict(value: float, limit: float, *, at_most: bool = True, unit: str = "") -> str:
    """'met' or how far off, for a target ``value <= limit`` (or ``>=``)."""
    if math.isnan(value):
        return "n/a"
    if (value <= limit) if at_most else (value >= limit):
        return "met"
    if at_most:
        return f"missed by {value - limit:.1f}{unit} ({value / limit:.1f}x)"
    return f"missed by {limit - value:.2f}{unit} ({value / limit:.0%} of it)"


def benchmark_model(model: str, args: argparse.Namespace, began: float) -> None:
    name = model_name(model)
    cache = Path(tempfile.mkdtemp(prefix="gpufrag-bench-"))
    path = materialize(model, cache)
    image_size = OnnxRuntimeBackend(path).inputs[0].shape[-1]
    other = "json" if args.protocol == "binary" else "binary"
    requests = {protocol: request_body(image_size, binary=protocol == "binary")
                for protocol in (args.protocol, other)}
    primary = args.protocol
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n=== model {model} ({image_size}x{image_size}), backend onnxruntime-cpu, "
          f"{os.cpu_count()} CPU cores (load average {load} at start), max queue delay "
          f"{args.delay_ms:g} ms, {args.seconds:g} s per phase, {primary} tensors "
          f"({len(requests[primary].body)} B/request; {other}: "
          f"{len(requests[other].body)} B); load generator on the same machine", flush=True)
    rows = []
    for size in args.sizes:
        rows.append(measure_size(model, name, path, cache, image_size, size, requests, args))
        print(f"  max batch {size}: done ({time.perf_counter() - began:.0f} s)", flush=True)

    print(f"\nthroughput at saturation ({primary}; closed loop, concurrency max(16, 2 x max "
          "batch), median of 3 runs; CPU per completed request)")
    header = (f"{'max batch':>9} | {'direct img/s':>12} | {'sat. req/s':>10} | "
              f"{'server/direct':>13} | {'srv CPU ms':>10} | {'client CPU ms':>13} | "
              f"{other + ' req/s':>11} | {other + ' srv CPU ms':>15}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r.size:>9} | {r.direct:>12.0f} | {r.saturation(primary):>10.0f} | "
              f"{r.saturation(primary) / r.direct:>13.2f} | {r.server_cpu_ms[primary]:>10.2f} | "
              f"{r.client_cpu_ms[primary]:>13.2f} | {r.saturation(other):>11.0f} | "
              f"{r.server_cpu_ms[other]:>15.2f}")
        runs = "/".join(f"{x:.0f}" for x in r.runs[primary])
        other_runs = "/".join(f"{x:.0f}" for x in r.runs[other])
        ratio = r.saturation(primary) / r.direct
        print(f"{'':>9}   runs {runs} ({other} {other_runs}) req/s; target server/direct >= "
              f"0.90: {verdict(ratio, 0.9, at_most=False)}")

    print(f"\nlatency at 70% of saturation ({primary}; open-loop Poisson arrivals, latency from "
          "the scheduled send); target p99 <= max queue delay + 2 x full-batch compute time "
          "(direct)")
    header = (f"{'max batch':>9} | {'offered req/s':>13} | {'sent req/s':>10} | {'p50 ms':>7} | "
              f"{'p99 ms':>7} | {'mean batch':>10} | {'batch ms':>8} | {'p99 bound ms':>12} | "
              "p99 target")
    print(header)
    print("-" * len(header))
    for r in rows:
        bound = args.delay_ms + 2 * r.batch_ms
        print(f"{r.size:>9} | {r.rate:>13.0f} | {r.sent:>10.0f} | {r.p50:>7.1f} | "
              f"{r.p99:>7.1f} | {r.mean_batch:>10.2f} | {r.batch_ms:>8.1f} | {bound:>12.1f} | "
              f"{verdict(r.p99, bound, unit=' ms')}"
              + (f"; {r.failed} requests failed" if r.failed else ""))

    overload(model, name, cache, requests[primary], rows[-1], args)
    print(f"\n({model}: {time.perf_counter() - began:.0f} s into the benchmark)", flush=True)


def overload(model: str, name: str, cache: Path, request: EncodedRequest, best: SizeResult,
             args: argparse.Namespace) -> None:
    """2x the measured saturation through a bounded queue, each request with a deadline."""
    size, rate = best.size, 2 * best.saturation(args.protocol)
    queue = 2 * size
    # A deadline the batcher can meet: with 2 full batches queued and one computing, an
    # admitted request finishes within ~3 batch times (Little's law sizing, as in the docs).
    deadline_ms = args.deadline_ms or max(250.0, math.ceil(4 * best.batch_ms / 50) * 50)
    server = start_server(model, cache, max_batch=size, delay_ms=args.delay_ms,
                          queue_size=queue, timeout_ms=deadline_ms)
    try:
        outcomes, sent, stats = asyncio.run(open_loop(server.url, name, request, rate=rate,
                                                      seconds=args.seconds,
                                                      timeout_ms=deadline_ms, seed=1,
                                                      connections=args.overload_connections))
    finally:
        server.stop()
    by_status: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_status.setdefault(o.status, []).append(o)
    accepted = [o.latency_s for o in by_status.get(200, [])]
    accepted_server = [o.server_s for o in by_status.get(200, [])]
    rejected = [o.latency_s for o in by_status.get(503, [])]
    rejected_server = [o.server_s for o in by_status.get(503, [])]
    timed_out = len(by_status.get(504, []))
    met = sum(1 for latency in accepted if latency * 1000 <= deadline_ms)
    met_server = sum(1 for latency in accepted_server if latency * 1000 <= deadline_ms)
    admitted = len(accepted) + timed_out
    pool = args.overload_connections or "unbounded"
    print(f"\n2x overload: max batch {size}, offered {rate:.0f} req/s (sent {sent:.0f}/s) over "
          f"{pool} connections, queue bound {queue}, deadline {deadline_ms:g} ms"
          f"{'' if args.deadline_ms else ' (auto: max(250, 4 x full-batch time))'}, "
          f"{len(outcomes)} requests")
    counts = ", ".join(f"{status or 'conn-error'}: {len(v)}"
                       for status, v in sorted(by_status.items()))
    print(f"  responses        {counts}")
    print(f"  server batches   mean {stats.mean_batch:.1f} rows, compute "
          f"{stats.compute_ms_per_batch:.0f} ms per batch (direct full batch: "
          f"{best.batch_ms:.0f} ms)")
    print("  (server = measured at the client from the request's headers leaving it; end to "
          "end = from the scheduled send, including any wait for a pooled connection)")
    reject_p50 = percentile_ms(rejected_server, 50)
    reject_p99 = percentile_ms(rejected_server, 99)
    print(f"  rejections (503) server p50 {reject_p50:.1f} ms, p99 {reject_p99:.1f} ms; end to "
          f"end p50 {percentile_ms(rejected, 50):.1f} ms, p99 "
          f"{percentile_ms(rejected, 99):.1f} ms")
    print(f"  accepted (200)   server p50 {percentile_ms(accepted_server, 50):.1f} ms, "
          f"p99 {percentile_ms(accepted_server, 99):.1f} ms, within deadline "
          f"{met_server}/{len(accepted)}; end to end p50 {percentile_ms(accepted, 50):.1f} ms, "
          f"p99 {percentile_ms(accepted, 99):.1f} ms, within deadline {met}/{len(accepted)}")
    within = met_server / admitted if admitted else math.nan
    print(f"  admitted         {admitted} (200 + 504); answered 200 within the deadline "
          f"(server): {within:.1%}; goodput {met / args.seconds:.0f} req/s (saturation was "
          f"{best.saturation(args.protocol):.0f})")
    print(f"  targets          rejection p50 < 5 ms: {verdict(reject_p50, 5, unit=' ms')}; "
          f"p99 < 5 ms: {verdict(reject_p99, 5, unit=' ms')}; admitted requests answered "
          f"within the deadline: {within:.1%}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="builtin:resnet-medium,builtin:resnet-small",
                        help="comma-separated model references")
    parser.add_argument("--batch-sizes", default="1,8,16,32")
    parser.add_argument("--protocol", choices=("binary", "json"), default="binary",
                        help="tensor encoding for every phase (the other is measured at "
                        "saturation for comparison)")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each load phase")
    parser.add_argument("--direct-seconds", type=float, default=2.0,
                        help="direct backend measurement per batch size (half before, half "
                        "after the server runs)")
    parser.add_argument("--deadline-ms", type=float, default=0.0,
                        help="per-request deadline in the overload run (0 = max(250 ms, 4 x "
                        "the full-batch compute time))")
    parser.add_argument("--overload-connections", type=int, default=256,
                        help="keep-alive connections the overload is offered through, as an "
                        "ingress proxy pools them (0 = a new one per waiting request)")
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.batch_sizes.split(",")]
    began = time.perf_counter()
    for model in args.models.split(","):
        benchmark_model(model.strip(), args, began)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ntotal benchmark time {time.perf_counter() - began:.0f} s (load average {load} "
          "at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
