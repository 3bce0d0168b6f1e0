"""Graceful termination under an open-loop load: SIGTERM mid-load loses no accepted request.

A real ``serve()`` (in this process, a fake model) gets requests at a fixed rate from threads on
127.0.0.1, each thread on its own keep-alive session, and is sent SIGTERM part-way through.
Each thread keeps one keep-alive session, or (``per-request``) opens a new connection for every
request, the two ways issue 33 saw resets at the end of the drain delay.
Every request must end as a 200 (accepted: before SIGTERM or during the drain delay) or a clean
503 with Retry-After (after admission closed) - never a reset, an EOF or a connection error.

The model is held by a gate from SIGTERM until the load has sent everything, so the drain
outlasts the load whatever the machine's speed: the phases do not depend on timing, only on
the order of events (readiness 503, delay, admission closed, drained, listener closed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests

from gpufrag.loops import loop_factory
from serving.backends.select import LoadedBackend
from serving.config import BatcherConfig, ServerConfig
from serving.server import serve
from serving.testing import FakeBackend
from tests.serving.test_serving_server import wait_until

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
TOTAL = 150          # requests in all
RATE_PER_S = 30.0    # open loop: request i is sent at i / RATE_PER_S, whatever came back
SIGTERM_AT = 45      # SIGTERM just before request 45 is sent (~1.5 s in)
DRAIN_DELAY_S = 1.5  # admission closes ~1.5 s after SIGTERM, ~2 s before the load ends

WAIT_S = 20.0  # generous: a loaded 2-core CI machine


@dataclass
class Outcome:
    index: int
    sent_s: float
    status: int | None = None
    connection: str | None = None
    retry_after: str | None = None
    error: str | None = None


def queue_depth(url: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("gpufrag_serving_queue_depth{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])  # the default, and the fallback
@pytest.mark.parametrize("connections", ["keep-alive", "per-request"])
def test_sigterm_under_open_loop_load_loses_no_accepted_request(event_loop: str,
                                                                connections: str) -> None:
    backend = FakeBackend()
    gate = threading.Event()
    config = ServerConfig(model="fake", model_name="fake", host="127.0.0.1", port=0,
                          batcher=BatcherConfig(max_batch_size=4, max_queue_delay_s=0.002,
                                                max_queue_size=4096, default_timeout_s=30.0),
                          drain_delay_s=DRAIN_DELAY_S, shutdown_timeout_s=20.0).validate()
    port: list[int] = []
    outcomes = [Outcome(i, 0.0) for i in range(TOTAL)]
    marks: dict[str, float] = {}
    local = threading.local()

    def send(outcome: Outcome, url: str) -> None:
        fresh = connections == "per-request"  # a new connection for every request
        session = getattr(local, "session", None)
        if fresh:
            session = requests.Session()
        elif session is None:  # one keep-alive connection per thread, as a pooled client has
            session = local.session = requests.Session()
        try:
            response = session.post(f"{url}/v2/models/fake/infer", json=BODY, timeout=30)
            outcome.status = response.status_code
            outcome.connection = response.headers.get("Connection")
            outcome.retry_after = response.headers.get("Retry-After")
            response.json()  # the whole body arrived and parses
        except Exception as exc:  # a reset, an EOF, a refused connection: a lost request
            outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            if fresh:
                session.close()

    def load() -> None:
        wait_until(lambda: bool(port), timeout_s=WAIT_S)
        url = f"http://127.0.0.1:{port[0]}"
        wait_until(lambda: requests.get(f"{url}/v2/health/ready", timeout=5).status_code == 200,
                   timeout_s=WAIT_S)
        # enough threads for every request the gate holds, so the load stays open-loop
        with ThreadPoolExecutor(max_workers=96) as pool:
            start = time.monotonic()
            for outcome in outcomes:
                if outcome.index == SIGTERM_AT:
                    backend.gate = gate  # from now on the drain lasts until the gate opens
                    marks["sigterm"] = time.monotonic() - start
                    os.kill(os.getpid(), signal.SIGTERM)
                    wait_until(lambda: requests.get(f"{url}/v2/health/ready",
                                                    timeout=5).status_code == 503,
                               timeout_s=WAIT_S)
                    marks["not_ready"] = time.monotonic() - start
                delay = start + outcome.index / RATE_PER_S - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                outcome.sent_s = time.monotonic() - start
                pool.submit(send, outcome, url)
            marks["last_sent"] = time.monotonic() - start

            # Everything sent is either answered or held inside the server (queued, or in a
            # batch the gate holds): only then may the drain finish and the listener close.
            def settled() -> bool:
                done = sum(o.status is not None or o.error is not None for o in outcomes)
                held = sum(backend.entered) - sum(backend.batches)
                return done + queue_depth(url) + held >= TOTAL

            wait_until(settled, timeout_s=WAIT_S)
            marks["gate_opened"] = time.monotonic() - start
            gate.set()

    helper = threading.Thread(target=load)
    helper.start()
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        code = runner.run(asyncio.wait_for(
            serve(config, on_listening=port.append,
                  load=lambda cfg, probe: LoadedBackend(backend, 0.01)), timeout=45))
    helper.join(timeout=30)
    assert not helper.is_alive()
    assert code == 0

    counts = Counter("lost" if o.error else o.status for o in outcomes)
    print(f"\ndrain under load: {dict(counts)}; marks (s): "
          f"{ {k: round(v, 2) for k, v in marks.items()} }")
    lost = [o for o in outcomes if o.error is not None]
    assert not lost, f"{len(lost)} lost: {lost[:3]}"
    assert set(counts) <= {200, 503}, counts
    assert counts[200] + counts[503] == TOTAL
    # every 200 was computed: the warm-up row plus one row per answered request
    assert sum(backend.batches) == counts[200] + 1
    # the drain delay admitted requests sent after readiness had turned 503
    assert any(o.status == 200 and o.sent_s > marks["not_ready"] for o in outcomes)
    # admission closed before the load ended, and those requests got a fast, clean 503
    late = [o for o in outcomes if o.status == 503]
    assert late and all(o.retry_after == "1" for o in late)
    assert all(o.sent_s > marks["not_ready"] for o in late)
    # once draining, every answer tells keep-alive clients to reconnect elsewhere
    after = [o for o in outcomes if o.sent_s > marks["not_ready"]]
    assert all(o.connection == "close" for o in after), Counter(o.connection for o in after)
    assert backend.closed
