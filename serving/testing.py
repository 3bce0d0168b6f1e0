"""Test doubles for the serving runtime, shipped with it (as ``structlog.testing`` is).

- :class:`FakeClock` — time that moves only when told; ``sleep_until`` resolves on ``advance``.
- :class:`InlineExecutor` — runs a batch synchronously on the calling thread, so a test with a
  fake clock needs no threads and no sleeps.
- :class:`FakeBackend` — a :class:`serving.backends.base.Backend` that records every batch, can
  fail on demand, block until released, or have a fixed batch dimension.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

import numpy as np

from serving import http1
from serving.app import ServerState
from serving.backends.base import Array, BaseBackend
from serving.batcher import DynamicBatcher
from serving.frontend import HttpLimits, front_end
from serving.metrics import ServingMetrics
from serving.protocol import ModelInfo
from serving.tensors import TensorSpec

P = ParamSpec("P")
T = TypeVar("T")


class FakeClock:
    """A :class:`serving.clock.Clock` whose ``now`` changes only through :meth:`advance`."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline_s: float) -> None:
        if deadline_s <= self._now:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_s, next(self._seq), future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    @property
    def sleepers(self) -> int:
        return sum(1 for _, _, f in self._sleepers if not f.done())


async def settle(rounds: int = 20) -> None:
    """Let every ready task on the loop run (no wall-clock time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class InlineExecutor(concurrent.futures.Executor):
    """Runs each submitted call at once on the caller's thread."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
               ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, like a pool would
            future.set_exception(exc)
        return future


class ManualExecutor(concurrent.futures.Executor):
    """Holds each submitted call until the test runs it with :meth:`finish_next`."""

    def __init__(self) -> None:
        self.pending: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
               ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.pending.append((lambda: fn(*args, **kwargs), future))
        return future

    def finish_next(self) -> None:
        call, future = self.pending.pop(0)
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)


class FakeBackend(BaseBackend):
    """Doubles each input row's values: output ``y`` = 2 * input ``x`` summed per row.

    ``fail_when(batch)`` returning True makes that batch raise; ``gate`` (a threading.Event)
    holds every batch until set; ``batches`` records the batch sizes (rows) seen, ``entered``
    the rows of every batch that reached the backend, counted before the gate holds it.
    """

    def __init__(self, *, features: int = 4, static_batch_size: int | None = None,
                 max_batch_size: int | None = None, dynamic_features: bool = False,
                 fail_when: Callable[[Mapping[str, Array]], bool] | None = None,
                 gate: threading.Event | None = None) -> None:
        feature_dim = -1 if dynamic_features else features
        super().__init__(kind="fake", inputs=(TensorSpec("x", "FP32", (-1, feature_dim)),),
                         outputs=(TensorSpec("y", "FP32", (-1, feature_dim)),
                                  TensorSpec("total", "FP32", (-1, 1))),
                         static_batch_size=static_batch_size, max_batch_size=max_batch_size)
        self.fail_when = fail_when
        self.gate = gate
        self.batches: list[int] = []
        self.entered: list[int] = []
        self.batch_inputs: list[dict[str, Array]] = []
        self.closed = False

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        self.entered.append(int(inputs["x"].shape[0]))
        if self.gate is not None:
            self.gate.wait(timeout=30)
        x = inputs["x"]
        self.batches.append(int(x.shape[0]))
        self.batch_inputs.append(dict(inputs))
        if self.fail_when is not None and self.fail_when(inputs):
            raise RuntimeError("injected backend failure")
        return {"y": x * 2, "total": x.reshape(x.shape[0], -1).sum(axis=1, keepdims=True)}

    def close(self) -> None:
        self.closed = True


def rows(n: int, features: int = 4, start: float = 0.0) -> dict[str, Array]:
    """A request's inputs for :class:`FakeBackend`: ``n`` rows of distinct values."""
    values = np.arange(start, start + n * features, dtype=np.float32).reshape(n, features)
    return {"x": values}


class ThreadedServer:
    """The front end and a batcher over ``backend``, on 127.0.0.1:<free port>, in a thread.

    For tests of the HTTP layer: real sockets and real requests, a fake model. ``with
    ThreadedServer(FakeBackend(), config) as server: requests.get(server.url + "/v2")``.
    """

    def __init__(self, backend: Any, config: Any, *, model_name: str = "fake",
                 max_body_bytes: int = 1 << 20, limits: HttpLimits | None = None) -> None:

        self.backend = backend
        self.config = config
        self.state = ServerState(model_name=model_name,
                                 metrics=ServingMetrics(model=model_name),
                                 max_body_bytes=max_body_bytes,
                                 retry_after_s=config.retry_after_s)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-server",
                                        daemon=True)
        self._front_end: http1.HttpServer | None = None
        self._limits = limits
        self.port = 0
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    @property
    def front_end(self) -> http1.HttpServer:
        """The HTTP/1.1 server, once started (tests of its close drive it directly)."""
        assert self._front_end is not None, "the server is not started"
        return self._front_end

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop thread and return its result."""
        async def wrapper() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout=10)

    async def _start(self) -> None:
        batcher = DynamicBatcher(self.backend, self.config, observer=self.state.metrics)
        batcher.start()
        self.state.batcher = batcher
        self.state.model = ModelInfo(name=self.state.model_name, platform=self.backend.kind,
                                     inputs=self.backend.inputs, outputs=self.backend.outputs,
                                     max_batch_size=self.config.max_batch_size)
        self.state.set_ready(True)
        self._front_end = front_end(self.state, self._limits)
        self.port = await self._front_end.start("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.port}"

    async def _stop(self) -> None:
        self.state.set_ready(False)
        if self.state.batcher is not None:
            await self.state.batcher.stop()
        if self._front_end is not None:
            await self._front_end.close(5.0)
