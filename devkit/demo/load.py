"""Stand-ins (``gpufrag serve`` processes) and the open-loop load generator that drives them."""

from __future__ import annotations

import asyncio
import math
import os
import random
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devkit.procs import ControlPlaneError, free_port, wait_until
from serving.client import encode_inputs

STANDIN_MODEL = "builtin:resnet-small"
LOAD_SECONDS_METRIC = "gpufrag_serving_model_load_seconds"


@dataclass
class StandIn:
    """``gpufrag serve --model builtin:resnet-small`` serving one Deployment's traffic.

    Known through its own HTTP API only, as a client would know it: the port is chosen here,
    readiness is ``/v2/health/ready``, the model's load time is its ``/metrics`` gauge. Its log
    is for people (``logs/serve-<deployment>.log``)."""

    deployment: str
    process: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    load_s: float = math.nan  # the server's own cold-start measurement

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, deployment: str, log_path: Path) -> StandIn:
        env = {**os.environ, "GPUFRAG_LOG_FORMAT": "json"}
        port = free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "gpufrag.cli", "serve", "--model", STANDIN_MODEL,
                 "--model-name", deployment, "--host", "127.0.0.1", "--port", str(port),
                 "--intra-op-threads", "1", "--max-queue-delay-ms", "2"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        return cls(deployment, process, log_path, port)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until ``/v2/health/ready`` answers 200; then read the model's load time."""
        def ready() -> bool | None:
            if self.process.poll() is not None:
                raise ControlPlaneError(f"gpufrag serve for {self.deployment} exited with "
                                        f"{self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=1) as reply:
                    return reply.status == 200 or None
            except OSError:  # not listening yet, or 503 while the model loads
                return None

        wait_until(ready, timeout_s=timeout_s, what=f"gpufrag serve for {self.deployment}")
        self.load_s = self._load_seconds()

    def _load_seconds(self) -> float:
        """The server's own measurement of its model load (NaN if it does not export it)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        for line in text.splitlines():
            if line.split("{", 1)[0].split(" ", 1)[0] == LOAD_SECONDS_METRIC:
                return float(line.rsplit(" ", 1)[1])
        return math.nan

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


@dataclass(frozen=True, slots=True)
class LoadResult:
    """One open-loop run: latency from each request's scheduled send time, errors (non-200 or
    no answer), and the mean batch size the servers formed (their own histogram)."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    mean_batch: float
    p99_ms_by_deployment: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "p50_ms": _round(self.p50_ms, 2), "p99_ms": _round(self.p99_ms, 2),
                "mean_batch": _round(self.mean_batch, 2),
                "p99_ms_by_deployment": {k: _round(v, 2)
                                         for k, v in self.p99_ms_by_deployment.items()}}


def _round(value: float, digits: int) -> float | None:
    return None if math.isnan(value) else round(value, digits)


def run_load(targets: Sequence[tuple[str, str]], *, rate_per_target: float, seconds: float,
             seed: int) -> LoadResult:
    """Poisson arrivals at ``rate_per_target`` per (url, model) for ``seconds``, each to a
    seeded-random target; arrivals never wait for answers (open loop)."""
    return asyncio.run(_open_loop(targets, rate_per_target, seconds, seed))


async def _open_loop(targets: Sequence[tuple[str, str]], rate_per_target: float,
                     seconds: float, seed: int) -> LoadResult:
    import aiohttp

    rng = random.Random(seed)
    image = np.random.default_rng(seed).random((1, 3, 32, 32), dtype=np.float32)
    request = encode_inputs({"input": image}, binary=True)
    headers = {**request.headers(), "Timeout-Ms": "2000"}
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        batches_before = [await _batch_histogram(session, url) for url, _ in targets]

        async def send(target: int, scheduled: float) -> tuple[int, float, bool]:
            url, model = targets[target]
            try:
                async with session.post(f"{url}/v2/models/{model}/infer", data=request.body,
                                        headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            return target, time.perf_counter() - scheduled, ok

        for t in range(len(targets)):  # one warm request each: connections and the model
            await send(t, time.perf_counter())
        tasks: list[asyncio.Task[tuple[int, float, bool]]] = []
        start = time.perf_counter()
        at = 0.0
        while True:
            at += rng.expovariate(rate_per_target * len(targets))
            if at >= seconds:
                break
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(rng.randrange(len(targets)), start + at)))
        outcomes = list(await asyncio.gather(*tasks))
        batches_after = [await _batch_histogram(session, url) for url, _ in targets]
    latencies = [s for _, s, ok in outcomes if ok]
    by_target: dict[str, float] = {}
    for t, (_, model) in enumerate(targets):
        mine = [s for i, s, ok in outcomes if ok and i == t]
        by_target[model] = _percentile_ms(mine, 99)
    batch_sum = sum(a[0] - b[0] for a, b in zip(batches_after, batches_before, strict=True))
    batch_n = sum(a[1] - b[1] for a, b in zip(batches_after, batches_before, strict=True))
    return LoadResult(requests=len(outcomes), errors=sum(1 for *_, ok in outcomes if not ok),
                      p50_ms=_percentile_ms(latencies, 50), p99_ms=_percentile_ms(latencies, 99),
                      mean_batch=batch_sum / batch_n if batch_n else math.nan,
                      p99_ms_by_deployment=by_target)


async def _batch_histogram(session: Any, url: str) -> tuple[float, float]:
    """(sum, count) of the server's ``gpufrag_serving_batch_size`` histogram."""
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    found = {"gpufrag_serving_batch_size_sum": 0.0, "gpufrag_serving_batch_size_count": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found["gpufrag_serving_batch_size_sum"], found["gpufrag_serving_batch_size_count"]


def _percentile_ms(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else math.nan
