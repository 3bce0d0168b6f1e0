"""Serving benchmark: what dynamic batching buys, measured side by side in one run.

For each max batch size (1, 8, 16, 32) it starts ``gpufrag serve`` as a subprocess and drives
it over HTTP with an asyncio load generator:

1. **Saturation** — a closed loop with enough concurrent requests to keep batches full
   (2 x max batch, at least 16): completed requests per second.
2. **70% of saturation** — an *open-loop* Poisson arrival process (arrivals do not wait for
   responses, as real users do not), latency measured from each request's *scheduled* send time
   so a stalled server cannot hide queueing (no coordinated omission): p50 / p99, and the mean
   batch size read from the server's own ``gpufrag_serving_batch_size`` histogram.
3. **Direct** — the same model through the same backend class, called in-process with no server,
   at that batch size: images per second. ``server/direct`` is saturation throughput over that.

Then a **2x overload** run at the largest batch size with a bounded queue and a per-request
deadline: how fast rejections (503) come back (p99), and whether accepted requests met their
deadline (answers of 200 within it; queued requests past it get 504 without being computed).

The load generator shares the machine with the server; on a small CPU box both compete for the
same cores, which the figures include. Usage::

    python benchmarks/serving_bench.py                 # ~2 minutes
    python benchmarks/serving_bench.py --seconds 3     # quicker, noisier
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
import orjson

from serving.backends.onnx_runtime import OnnxRuntimeBackend
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


def request_body(image_size: int) -> bytes:
    image = np.random.default_rng(0).random((1, 3, image_size, image_size), dtype=np.float32)
    return orjson.dumps({"inputs": [{"name": "input", "shape": list(image.shape),
                                     "datatype": "FP32", "data": image.ravel()}]},
                        option=orjson.OPT_SERIALIZE_NUMPY)


async def scrape(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


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


async def closed_loop(url: str, model: str, body: bytes, *, concurrency: int,
                      seconds: float) -> float:
    """Requests per second with ``concurrency`` requests always outstanding."""
    infer = f"{url}/v2/models/{model}/infer"
    headers = {"Content-Type": "application/json"}
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


async def open_loop(url: str, model: str, body: bytes, *, rate: float, seconds: float,
                    timeout_ms: float | None = None, seed: int = 0, connections: int = 0
                    ) -> tuple[list[Outcome], float, float, float]:
    """Poisson arrivals at ``rate``/s; returns outcomes, achieved send rate, and the batch
    histogram's (sum, count) increase over the run. ``connections`` bounds the client's
    keep-alive pool (0 = a new connection whenever none is idle), as a proxy fleet would."""
    rng = random.Random(seed)
    infer = f"{url}/v2/models/{model}/infer"
    headers = {"Content-Type": "application/json"}
    if timeout_ms is not None:
        headers["Timeout-Ms"] = str(int(timeout_ms))
    async with _timed_session(connections) as session:
        batch_sum0 = await scrape(session, url, "gpufrag_serving_batch_size_sum")
        batch_n0 = await scrape(session, url, "gpufrag_serving_batch_size_count")
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
        batch_sum = await scrape(session, url, "gpufrag_serving_batch_size_sum") - batch_sum0
        batch_n = await scrape(session, url, "gpufrag_serving_batch_size_count") - batch_n0
    return outcomes, sent_rate, batch_sum, batch_n


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan


def direct_throughput(path: Path, image_size: int, batch: int, seconds: float) -> float:
    """Images per second through the backend in-process, no HTTP, no batcher."""
    backend = OnnxRuntimeBackend(path)
    x = np.random.default_rng(0).random((batch, 3, image_size, image_size), dtype=np.float32)
    for _ in range(3):
        backend.infer({"input": x})
    runs = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        backend.infer({"input": x})
        runs += 1
    return runs * batch / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:resnet-small")
    parser.add_argument("--batch-sizes", default="1,8,16,32")
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each load phase")
    parser.add_argument("--deadline-ms", type=float, default=250.0,
                        help="per-request deadline in the overload run")
    parser.add_argument("--overload-connections", type=int, default=256,
                        help="keep-alive connections the overload is offered through, as an "
                        "ingress proxy pools them (0 = a new one per waiting request)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    name = model_name(args.model)
    cache = Path(tempfile.mkdtemp(prefix="gpufrag-bench-"))
    path = materialize(args.model, cache)
    image_size = OnnxRuntimeBackend(path).inputs[0].shape[-1]
    body = request_body(image_size)
    began = time.perf_counter()

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"model {args.model} ({image_size}x{image_size}), backend onnxruntime-cpu, "
          f"{os.cpu_count()} CPU cores (load average {load} at start), max queue delay "
          f"{args.delay_ms:g} ms, {args.seconds:g} s per phase; load generator on the same "
          "machine")
    rows = []
    for size in sizes:
        direct = direct_throughput(path, image_size, size, min(2.0, args.seconds / 2))
        server = start_server(args.model, cache, max_batch=size, delay_ms=args.delay_ms,
                              queue_size=4096, timeout_ms=30_000)
        concurrency = max(16, 2 * size)
        try:
            # Saturation: the median of three closed-loop runs, as other work on a shared
            # machine moves any single figure.
            runs = []
            cpu_per_request = []
            for _ in range(3):
                cpu0 = cpu_seconds(server.process.pid)
                runs.append(asyncio.run(closed_loop(server.url, name, body,
                                                    concurrency=concurrency,
                                                    seconds=args.seconds / 3)))
                cpu_per_request.append((cpu_seconds(server.process.pid) - cpu0)
                                       / max(1.0, runs[-1] * args.seconds / 3))
            saturation = float(np.median(runs))
            outcomes, sent, batch_sum, batch_n = asyncio.run(open_loop(
                server.url, name, body, rate=0.7 * saturation, seconds=args.seconds,
                connections=2 * concurrency))
        finally:
            server.stop()
        ok = [o.latency_s for o in outcomes if o.status == 200]
        rows.append({"size": size, "saturation": saturation, "runs": runs,
                     "rate": 0.7 * saturation, "sent": sent, "p50": percentile_ms(ok, 50),
                     "p99": percentile_ms(ok, 99), "failed": len(outcomes) - len(ok),
                     "mean_batch": batch_sum / batch_n if batch_n else math.nan,
                     "cpu_ms": 1000 * float(np.median(cpu_per_request)),
                     "direct": direct, "ratio": saturation / direct})
        print(f"  max batch {size}: done ({time.perf_counter() - began:.0f} s)", flush=True)

    print()
    header = (f"{'max batch':>9} | {'sat. req/s':>10} | {'srv CPU ms/req':>14} | "
              f"{'70% load':>8} | {'p50 ms':>7} | {'p99 ms':>7} | {'mean batch':>10} | "
              f"{'direct img/s':>12} | {'server/direct':>13}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['size']:>9} | {r['saturation']:>10.0f} | {r['cpu_ms']:>14.2f} | "
              f"{r['sent']:>8.0f} | {r['p50']:>7.1f} | {r['p99']:>7.1f} | "
              f"{r['mean_batch']:>10.2f} | {r['direct']:>12.0f} | {r['ratio']:>13.2f}")
        spread = "/".join(f"{x:.0f}" for x in r["runs"])
        print(f"{'':>9}   saturation runs {spread} req/s"
              + (f"; {r['failed']} requests failed at 70% load" if r["failed"] else ""))

    best = rows[-1]  # the largest max batch size (the server's default is 32)
    size, rate = best["size"], 2 * best["saturation"]
    queue = 2 * size
    server = start_server(args.model, cache, max_batch=size, delay_ms=args.delay_ms,
                          queue_size=queue, timeout_ms=args.deadline_ms)
    try:
        outcomes, sent, _, _ = asyncio.run(open_loop(server.url, name, body, rate=rate,
                                                     seconds=args.seconds,
                                                     timeout_ms=args.deadline_ms, seed=1,
                                                     connections=args.overload_connections))
    finally:
        server.stop()
    by_status: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_status.setdefault(o.status, []).append(o)
    accepted = [o.latency_s for o in by_status.get(200, [])]
    rejected = [o.latency_s for o in by_status.get(503, [])]
    rejected_server = [o.server_s for o in by_status.get(503, [])]
    accepted_server = [o.server_s for o in by_status.get(200, [])]
    met = sum(1 for latency in accepted if latency * 1000 <= args.deadline_ms)
    met_server = sum(1 for latency in accepted_server if latency * 1000 <= args.deadline_ms)
    print()
    pool = args.overload_connections or "unbounded"
    print(f"2x overload: max batch {size}, offered {rate:.0f} req/s (sent {sent:.0f}/s) over "
          f"{pool} connections, queue bound {queue}, deadline {args.deadline_ms:g} ms, "
          f"{len(outcomes)} requests")
    counts = ", ".join(f"{status or 'conn-error'}: {len(v)}"
                       for status, v in sorted(by_status.items()))
    print(f"  responses        {counts}")
    print("  (end to end = from the scheduled send; server = from the request's headers "
          "leaving the client)")
    print(f"  rejections (503) server p50 {percentile_ms(rejected_server, 50):.1f} ms, "
          f"p99 {percentile_ms(rejected_server, 99):.1f} ms; end to end p50 "
          f"{percentile_ms(rejected, 50):.1f} ms, p99 {percentile_ms(rejected, 99):.1f} ms")
    print(f"  accepted (200)   server p50 {percentile_ms(accepted_server, 50):.1f} ms, "
          f"p99 {percentile_ms(accepted_server, 99):.1f} ms, within deadline "
          f"{met_server}/{len(accepted)}; end to end p50 {percentile_ms(accepted, 50):.1f} ms, "
          f"p99 {percentile_ms(accepted, 99):.1f} ms, within deadline {met}/{len(accepted)} "
          f"({100 * met / max(1, len(accepted)):.1f}%)")
    print(f"  goodput          {met / args.seconds:.0f} req/s answered within the deadline "
          f"(saturation was {best['saturation']:.0f})")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\ntotal benchmark time {time.perf_counter() - began:.0f} s (load average {load} "
          "at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
