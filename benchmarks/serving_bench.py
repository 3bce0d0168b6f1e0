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
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from benchmarks import results
from benchmarks.procstat import cpu_seconds, thread_cpu_seconds
from benchmarks.serving_ipc import handoff_cost
from benchmarks.serving_load import LoadGenerator, Outcome, raw_request
from gpufrag.loops import new_event_loop
from serving.backends.base import Backend
from serving.backends.onnx_runtime import OnnxRuntimeBackend
from serving.client import EncodedRequest, encode_inputs
from serving.models import materialize, model_name

T = TypeVar("T")


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    port: int
    event_loop: str
    log_tail: list[str] = field(default_factory=list)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(model: str, cache: Path, *, max_batch: int, delay_ms: float,
                 queue_size: int, timeout_ms: float, event_loop: str = "uvloop",
                 backend: str = "auto") -> Server:
    """``gpufrag serve`` on a free loopback port, its caches (models, TensorRT engines) under
    ``cache``; returns once it logs ``ready``."""
    env = {**os.environ, "GPUFRAG_CACHE_DIR": str(cache), "GPUFRAG_LOG_FORMAT": "json"}
    command = [sys.executable, "-m", "gpufrag.cli", "serve", "--model", model,
               "--backend", backend,
               "--host", "127.0.0.1", "--port", "0", "--max-batch-size", str(max_batch),
               "--max-queue-delay-ms", str(delay_ms), "--max-queue-size", str(queue_size),
               "--default-timeout-ms", str(timeout_ms), "--event-loop", event_loop,
               "--drain-delay-s", "0"]
    # Its own session: with the kernel's autogroup scheduling a session's threads share one
    # fair slice of the CPUs, so in the benchmark's session the server would split one slice
    # with the load generator while the direct measurement had one to itself. A server pod
    # gets CPU of its own, apart from its clients; this is the nearest a shared box comes.
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
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
    server = Server(process, f"http://127.0.0.1:{port}", port, event_loop, tail)

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


def scrape(url: str, names: Sequence[str] = SCRAPED) -> dict[str, float]:
    """The server's own samples named in ``names`` (summed over labels; 0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    totals = dict.fromkeys(names, 0.0)
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


def stats_between(before: dict[str, float], after: dict[str, float]) -> ServerStats:
    gained = {name: after[name] - before[name] for name in SCRAPED}
    return ServerStats(batches=gained["gpufrag_serving_batch_size_count"],
                       rows=gained["gpufrag_serving_batch_size_sum"],
                       compute_s=gained["gpufrag_serving_compute_duration_seconds_sum"])


def run_client(make: Callable[[], Awaitable[T]]) -> T:
    """Run one load phase on a fresh client loop (uvloop when installed)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(make())  # type: ignore[arg-type]


@dataclass
class Cpu:
    """CPU spent over one phase, per completed request: the server's event-loop (main) thread,
    its other threads (the model's compute, batch assembly), and the load generator."""

    loop_ms: float
    compute_ms: float
    client_ms: float
    client_cores: float  # the load generator's CPU over the phase's wall time (<= 1: one thread)


class CpuMeter:
    def __init__(self, server: Server) -> None:
        self._pid = server.process.pid
        self._loop0 = thread_cpu_seconds(self._pid, self._pid)
        self._total0 = cpu_seconds(self._pid)
        self._client0 = time.process_time()
        self._wall0 = time.perf_counter()

    def per_request(self, done: int) -> Cpu:
        n = max(done, 1)
        loop = thread_cpu_seconds(self._pid, self._pid) - self._loop0
        total = cpu_seconds(self._pid) - self._total0
        client = time.process_time() - self._client0
        wall = time.perf_counter() - self._wall0
        return Cpu(1000 * loop / n, 1000 * (total - loop) / n, 1000 * client / n,
                   client / wall if wall > 0 else math.nan)


@dataclass(frozen=True)
class Saturation:
    rate: float  # completed requests per second
    cpu: Cpu
    model_busy: float  # backend compute time over the phase's wall time


def closed_loop(server: Server, payload: bytes, *, concurrency: int,
                seconds: float) -> Saturation:
    """Requests per second with ``concurrency`` requests always outstanding (one per
    keep-alive connection); the CPU it took, and the share of it the model computed (from
    the server's histogram, batches finished within the phase)."""

    async def phase() -> Saturation:
        generator = LoadGenerator("127.0.0.1", server.port, payload)
        try:
            await generator.closed_loop(min(concurrency, 8), 0.3)  # connections, model warm
            before = scrape(server.url)
            meter = CpuMeter(server)
            started = time.perf_counter()
            outcomes = await generator.closed_loop(concurrency, seconds)
            elapsed = time.perf_counter() - started
            done = sum(1 for o in outcomes if o.status == 200)
            cpu = meter.per_request(done)
            stats = stats_between(before, scrape(server.url))
            return Saturation(done / elapsed, cpu, stats.compute_s / elapsed)
        finally:
            generator.close()

    return run_client(phase)


def open_loop(server: Server, payload: bytes, *, rate: float, seconds: float, seed: int = 0,
              connections: int) -> tuple[list[Outcome], float, ServerStats, Cpu]:
    """Poisson arrivals at ``rate``/s through a pool of at most ``connections`` keep-alive
    connections (as a proxy fleet would); returns outcomes, the achieved send rate, what the
    server's histograms gained over the run, and the CPU spent."""

    async def phase() -> tuple[list[Outcome], float, ServerStats, Cpu]:
        generator = LoadGenerator("127.0.0.1", server.port, payload)
        try:
            before = scrape(server.url)
            meter = CpuMeter(server)
            outcomes, sent = await generator.open_loop(rate, seconds, connections, seed=seed)
            cpu = meter.per_request(len(outcomes))
            return outcomes, sent, stats_between(before, scrape(server.url)), cpu
        finally:
            generator.close()

    return run_client(phase)


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


def direct_throughput(path: Path, image_size: int, batch: int, seconds: float,
                      open_backend: Callable[[], Backend] | None = None) -> tuple[float, float]:
    """Images per second through the backend in-process, no HTTP, no batcher (by default ONNX
    Runtime with the server's settings: all cores but one; ``open_backend`` loads another, as
    the server would), and the CPU milliseconds per image."""
    backend = open_backend() if open_backend is not None else OnnxRuntimeBackend(path)
    x = np.random.default_rng(0).random((batch, 3, image_size, image_size), dtype=np.float32)
    for _ in range(2):
        backend.infer({"input": x})
    runs = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds or runs < 2:
        backend.infer({"input": x})
        runs += 1
    rate = runs * batch / (time.perf_counter() - started)
    cpu_ms = 1000 * (time.process_time() - cpu0) / (runs * batch)
    backend.close()
    return rate, cpu_ms


@dataclass(frozen=True)
class Variant:
    """One way of serving the same model in the saturation phase: tensor encoding and the
    server's event loop. ``label`` heads its columns."""

    protocol: str
    event_loop: str

    @property
    def label(self) -> str:
        return f"{self.protocol}/{self.event_loop}"


@dataclass
class SizeResult:
    """Everything measured at one max batch size."""

    size: int
    direct: float  # images/s, the mean of a measurement before and one after the server's
    runs: dict[Variant, list[float]]  # saturation req/s of each closed-loop run
    cpu: dict[Variant, list[Cpu]]
    busy: dict[Variant, list[float]]  # share of the phase the model was computing
    rate: float = 0.0
    sent: float = 0.0
    p50: float = math.nan
    p99: float = math.nan
    failed: int = 0
    mean_batch: float = math.nan
    direct_cpu_ms: float = math.nan  # CPU per image, direct

    def saturation(self, variant: Variant) -> float:
        return float(np.median(self.runs[variant]))

    def ratio(self, variant: Variant) -> float:
        return self.saturation(variant) / self.direct

    def cpu_ms(self, variant: Variant, part: str) -> float:
        return float(np.median([getattr(c, part) for c in self.cpu[variant]]))

    def cpu_efficiency(self, variant: Variant) -> float:
        """Direct CPU per image over the server's CPU per request (event loop + compute): the
        ratio's ceiling when CPU, not the pipeline, is what runs out (a shared machine)."""
        total = self.cpu_ms(variant, "loop_ms") + self.cpu_ms(variant, "compute_ms")
        return self.direct_cpu_ms / total if total else math.nan

    def model_busy(self, variant: Variant) -> float:
        return float(np.median(self.busy[variant]))

    @property
    def batch_ms(self) -> float:
        """Time to compute one full batch directly."""
        return 1000 * self.size / self.direct


def saturation_concurrency(size: int) -> int:
    """Outstanding requests that keep the model busy: one batch computing, one handed ahead,
    one filling, and a batch's worth in flight on the wire (4 x max batch, at least 16).
    With only 2 x, the responses of the batch that just finished are the only requests that
    can fill the next one, so the model waits on a round trip through client and server."""
    return max(16, 4 * size)


def measure_size(model: str, name: str, path: Path, cache: Path, image_size: int, size: int,
                 payloads: dict[str, bytes], variants: list[Variant],
                 args: argparse.Namespace) -> SizeResult:
    before = direct_throughput(path, image_size, size, args.direct_seconds / 2)
    servers = {loop: start_server(model, cache, max_batch=size, delay_ms=args.delay_ms,
                                  queue_size=4096, timeout_ms=30_000, event_loop=loop)
               for loop in dict.fromkeys(v.event_loop for v in variants)}
    concurrency = saturation_concurrency(size)
    result = SizeResult(size, math.nan, {v: [] for v in variants}, {v: [] for v in variants},
                        {v: [] for v in variants})
    primary = variants[0]
    try:
        # Saturation: three closed-loop runs per variant, interleaved, so background load on
        # a shared machine falls on all of them alike; medians are reported.
        phase_s = args.seconds / 3
        for _ in range(3):
            for variant in variants:
                run = closed_loop(servers[variant.event_loop], payloads[variant.protocol],
                                  concurrency=concurrency, seconds=phase_s)
                result.runs[variant].append(run.rate)
                result.cpu[variant].append(run.cpu)
                result.busy[variant].append(run.model_busy)
        result.rate = 0.7 * result.saturation(primary)
        outcomes, result.sent, stats, _ = open_loop(
            servers[primary.event_loop], payloads[primary.protocol], rate=result.rate,
            seconds=args.seconds, connections=2 * concurrency)
    finally:
        for server in servers.values():
            server.stop()
    ok = [o.latency_s for o in outcomes if o.status == 200]
    result.p50, result.p99 = percentile_ms(ok, 50), percentile_ms(ok, 99)
    result.failed = len(outcomes) - len(ok)
    result.mean_batch = stats.mean_batch
    after = direct_throughput(path, image_size, size, args.direct_seconds / 2)
    result.direct = (before[0] + after[0]) / 2
    result.direct_cpu_ms = (before[1] + after[1]) / 2
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


def benchmark_model(model: str, args: argparse.Namespace,
                    began: float) -> list[results.Figure]:
    name = model_name(model)
    cache = Path(tempfile.mkdtemp(prefix="gpufrag-bench-"))
    path = materialize(model, cache)
    image_size = OnnxRuntimeBackend(path).inputs[0].shape[-1]
    other = "json" if args.protocol == "binary" else "binary"
    requests = {protocol: request_body(image_size, binary=protocol == "binary")
                for protocol in (args.protocol, other)}
    infer_path = f"/v2/models/{name}/infer"
    payloads = {protocol: raw_request("127.0.0.1", infer_path, r.body, r.headers())
                for protocol, r in requests.items()}
    loops = args.loops
    variants = [Variant(args.protocol, loop) for loop in loops] + [Variant(other, loops[0])]
    primary = variants[0]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\n=== model {model} ({image_size}x{image_size}), backend onnxruntime-cpu, "
          f"{os.cpu_count()} CPU cores (load average {load} at start), max queue delay "
          f"{args.delay_ms:g} ms, {args.seconds:g} s per phase, {args.protocol} tensors "
          f"({len(requests[args.protocol].body)} B/request; {other}: "
          f"{len(requests[other].body)} B); server event loops: {', '.join(loops)}; load "
          "generator (benchmarks/serving_load.py: one thread, raw asyncio protocols on uvloop) "
          "on the same machine", flush=True)
    rows = []
    figures: list[results.Figure] = []
    for size in args.sizes:
        rows.append(measure_size(model, name, path, cache, image_size, size, payloads,
                                 variants, args))
        print(f"  max batch {size}: done ({time.perf_counter() - began:.0f} s)", flush=True)

    print(f"\nthroughput at saturation (closed loop, concurrency max(16, 4 x max batch), "
          "median of 3 runs per variant, the variants' runs interleaved; CPU per completed "
          "request: the server's event-loop thread, its other threads (model compute, batch "
          "assembly), the load generator; model busy = share of the phase the backend was "
          "computing; CPU eff. = direct CPU per image / server CPU per request, the ratio's "
          "ceiling where CPU runs out); the target applies to "
          f"{primary.label}, the default")
    header = (f"{'max batch':>9} | {'variant':>14} | {'direct img/s':>12} | "
              f"{'sat. req/s':>10} | {'server/direct':>13} | {'loop CPU ms':>11} | "
              f"{'compute CPU ms':>14} | {'CPU eff.':>8} | {'model busy':>10} | "
              f"{'client CPU ms':>13} | runs")
    print(header)
    print("-" * len(header))
    for r in rows:
        for variant in variants:
            runs = "/".join(f"{x:.0f}" for x in r.runs[variant])
            print(f"{r.size:>9} | {variant.label:>14} | {r.direct:>12.0f} | "
                  f"{r.saturation(variant):>10.0f} | {r.ratio(variant):>13.2f} | "
                  f"{r.cpu_ms(variant, 'loop_ms'):>11.3f} | "
                  f"{r.cpu_ms(variant, 'compute_ms'):>14.3f} | "
                  f"{r.cpu_efficiency(variant):>8.2f} | {r.model_busy(variant):>10.0%} | "
                  f"{r.cpu_ms(variant, 'client_ms'):>13.3f} | {runs}")
        figures.append(results.Figure(
            f"{name}, max batch {r.size}: server/direct ({primary.label})",
            round(r.ratio(primary), 2), "", results.Target(">=", 0.9)))
        print(f"{'':>9}   direct CPU {r.direct_cpu_ms:.3f} ms per image; target "
              f"server/direct >= 0.90 ({primary.label}): "
              f"{verdict(r.ratio(primary), 0.9, at_most=False)}")
    client_cores = max(c.client_cores for r in rows for c in r.cpu[primary])

    print(f"load generator: at most {client_cores:.2f} of one core in any saturation run")

    print(f"\nlatency at 70% of saturation ({primary.label}; open-loop Poisson arrivals, "
          "latency from the scheduled send); target p99 <= max queue delay + 2 x full-batch "
          "compute time (direct)")
    header = (f"{'max batch':>9} | {'offered req/s':>13} | {'sent req/s':>10} | {'p50 ms':>7} | "
              f"{'p99 ms':>7} | {'mean batch':>10} | {'batch ms':>8} | {'p99 bound ms':>12} | "
              "p99 target")
    print(header)
    print("-" * len(header))
    for r in rows:
        bound = args.delay_ms + 2 * r.batch_ms
        figures.append(results.Figure(
            f"{name}, max batch {r.size}: p99 at 70% of saturation (bound: queue delay + 2 x "
            "full-batch compute)", round(r.p99, 1), "ms", results.Target("<=", round(bound, 1))))
        print(f"{r.size:>9} | {r.rate:>13.0f} | {r.sent:>10.0f} | {r.p50:>7.1f} | "
              f"{r.p99:>7.1f} | {r.mean_batch:>10.2f} | {r.batch_ms:>8.1f} | {bound:>12.1f} | "
              f"{verdict(r.p99, bound, unit=' ms')}"
              + (f"; {r.failed} requests failed" if r.failed else ""))

    figures += overload(model, cache, payloads[primary.protocol], rows[-1], primary, args)
    handoff(requests[primary.protocol], rows[-1], primary)
    print(f"\n({model}: {time.perf_counter() - began:.0f} s into the benchmark)", flush=True)
    return [f for f in figures if math.isfinite(f.value)]  # a phase with no answers has none


def handoff(request: EncodedRequest, best: SizeResult, primary: Variant) -> None:
    """What several front-end processes feeding one batcher would add per request: the decoded
    tensor handed to another process and the answer handed back (measured here, in this
    process and a child), next to what the event loop spends on a whole request now."""
    rows = 1
    nbytes = len(request.body) - (request.header_length or 0)
    cost = handoff_cost(nbytes, answer_bytes=40 * rows)
    loop_ms = best.cpu_ms(primary, "loop_ms")
    print(f"\nfront-end processes -> one batcher (SO_REUSEPORT acceptors): handing one "
          f"request's {nbytes} B tensor to the batcher process and its answer back costs "
          f"{cost.pipe_us:.0f} us of CPU through a pipe, {cost.shm_us:.0f} us through shared "
          f"memory + a pipe for the signal (both sides summed); the event loop spends "
          f"{1000 * loop_ms:.0f} us on a whole request at max batch {best.size} and is busy "
          f"{loop_ms * best.saturation(primary) / 1000:.0%} of one core at saturation")


def overload(model: str, cache: Path, payload: bytes, best: SizeResult, primary: Variant,
             args: argparse.Namespace) -> list[results.Figure]:
    """2x the measured saturation through a bounded queue, each request with a deadline."""
    size, rate = best.size, 2 * best.saturation(primary)
    queue = 2 * size
    # A deadline the batcher can meet: with 2 full batches queued and one computing, an
    # admitted request finishes within ~3 batch times (Little's law sizing, as in the docs).
    deadline_ms = args.deadline_ms or max(250.0, math.ceil(4 * best.batch_ms / 50) * 50)
    server = start_server(model, cache, max_batch=size, delay_ms=args.delay_ms,
                          queue_size=queue, timeout_ms=deadline_ms,
                          event_loop=primary.event_loop)
    try:
        outcomes, sent, stats, cpu = open_loop(server, payload, rate=rate, seconds=args.seconds,
                                               seed=1, connections=args.overload_connections)
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
    print(f"\n2x overload ({primary.label}): max batch {size}, offered {rate:.0f} req/s (sent "
          f"{sent:.0f}/s) over {args.overload_connections} keep-alive connections, queue bound "
          f"{queue}, deadline {deadline_ms:g} ms"
          f"{'' if args.deadline_ms else ' (auto: max(250, 4 x full-batch time))'}, "
          f"{len(outcomes)} requests")
    counts = ", ".join(f"{status or 'conn-error'}: {len(v)}"
                       for status, v in sorted(by_status.items()))
    print(f"  responses        {counts}")
    print(f"  server batches   mean {stats.mean_batch:.1f} rows, compute "
          f"{stats.compute_ms_per_batch:.0f} ms per batch (direct full batch: "
          f"{best.batch_ms:.0f} ms)")
    print(f"  load generator   {cpu.client_cores:.2f} of one core ({1000 * cpu.client_ms:.0f} us "
          f"per request; one thread); server event loop {1000 * cpu.loop_ms:.0f} us per request")
    print("  (server = measured at the client from the request's bytes leaving it; end to "
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
          f"{best.saturation(primary):.0f})")
    print(f"  targets          rejection p50 < 5 ms: {verdict(reject_p50, 5, unit=' ms')}; "
          f"p99 < 5 ms: {verdict(reject_p99, 5, unit=' ms')}; admitted requests answered "
          f"within the deadline: {within:.1%}")
    what = f"{model_name(model)}, 2x overload at max batch {size}"
    return [
        results.Figure(f"{what}: rejection (503) p50, server", round(reject_p50, 2), "ms",
                       results.Target("<", 5.0)),
        results.Figure(f"{what}: rejection (503) p99, server", round(reject_p99, 2), "ms",
                       results.Target("<", 5.0)),
        results.Figure(f"{what}: admitted requests answered within the deadline",
                       round(100 * within, 1), "%")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="builtin:resnet-medium,builtin:resnet-small",
                        help="comma-separated model references")
    parser.add_argument("--batch-sizes", default="1,8,16,32")
    parser.add_argument("--protocol", choices=("binary", "json"), default="binary",
                        help="tensor encoding for every phase (the other is measured at "
                        "saturation for comparison)")
    parser.add_argument("--event-loops", default="uvloop,asyncio",
                        help="server event loops measured side by side at saturation; the "
                        "first is used for every other phase")
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
    results.add_arguments(parser, "serving_bench")
    args = parser.parse_args(argv)
    start = results.Start.now()
    args.sizes = [int(s) for s in args.batch_sizes.split(",")]
    args.loops = [loop.strip() for loop in args.event_loops.split(",") if loop.strip()]
    began = time.perf_counter()
    figures = [f for model in args.models.split(",")
               for f in benchmark_model(model.strip(), args, began)]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ntotal benchmark time {time.perf_counter() - began:.0f} s (load average {load} "
          "at the end)")
    results.record(args, "serving_bench", start, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
