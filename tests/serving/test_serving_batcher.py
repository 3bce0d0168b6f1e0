"""The dynamic batcher: triggers, bounds, deadlines, cancellation, faults, shapes, drain.

Time is a FakeClock and compute runs inline, so every case is exact and takes no wall time.
(Test modules carry a ``test_serving_`` prefix: tests/ has no packages, so basenames must be
unique across the whole tree.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from serving.batcher import (
    Dispatch,
    DynamicBatcher,
    PendingRequest,
    Signature,
    Wait,
    assemble,
    plan_batch,
    signature_of,
    split_outputs,
)
from serving.config import BatcherConfig
from serving.errors import (
    BackendFailed,
    InvalidRequest,
    QueueFull,
    RequestTimedOut,
    ShuttingDown,
)
from serving.testing import (
    FakeBackend,
    FakeClock,
    InlineExecutor,
    ManualExecutor,
    rows,
    settle,
)


@dataclass(frozen=True)
class Item:
    rows: int
    enqueued_s: float = 0.0
    signature: Signature = (("x", "<f4", (4,)),)


OTHER: Signature = (("x", "<f4", (8,)),)


class Recorder:
    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}
        self.batches: list[int] = []
        self.waits: list[float] = []
        self.depths: list[int] = []

    def queue_depth(self, depth: int) -> None:
        self.depths.append(depth)

    def outcome(self, outcome: str, count: int = 1) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + count

    def batch(self, rows: int, queue_waits_s: Any, compute_s: float) -> None:
        self.batches.append(rows)
        self.waits.extend(queue_waits_s)


def cfg(**overrides: Any) -> BatcherConfig:
    base: dict[str, Any] = {"max_batch_size": 4, "max_queue_delay_s": 0.005,
                            "max_queue_size": 16, "default_timeout_s": 1.0}
    base.update(overrides)
    return BatcherConfig(**base)


# -- plan_batch: the pure decision ------------------------------------------------------------

@pytest.mark.parametrize(("items", "now", "overrides", "expected"), [
    ([], 0.0, {}, None),
    ([Item(1)], 0.0, {}, Wait(0.005)),
    ([Item(1)], 0.005, {}, ("max_queue_delay", 1)),
    ([Item(1)] * 4, 0.0, {}, ("max_batch_size", 4)),
    ([Item(3), Item(2)], 0.0, {}, ("max_batch_size", 3)),  # the next one does not fit
    ([Item(4)], 0.0, {}, ("max_batch_size", 4)),
    ([Item(1), Item(1, signature=OTHER), Item(1)], 0.005, {}, ("max_queue_delay", 2)),
    ([Item(1)] * 3, 0.0, {"preferred_batch_sizes": (2,)}, ("preferred_batch_size", 2)),
    ([Item(1)] * 3, 0.0, {"preferred_batch_sizes": (2, 3)}, ("preferred_batch_size", 3)),
    ([Item(2), Item(1)], 0.0, {"preferred_batch_sizes": (2, 4)}, ("preferred_batch_size", 2)),
    ([Item(1), Item(2)], 0.0, {"preferred_batch_sizes": (2,)}, Wait(0.005)),
    ([Item(1)], 0.0, {"max_queue_delay_s": 0.0}, ("max_queue_delay", 1)),
])
def test_plan_batch(items: list[Item], now: float, overrides: dict[str, Any],
                    expected: Any) -> None:
    plan = plan_batch(items, now, cfg(**overrides))
    if isinstance(plan, Dispatch):
        assert (plan.reason, plan.rows) == expected
    else:
        assert plan == expected


def test_delay_is_timed_from_the_oldest_request_not_the_newest() -> None:
    queue = [Item(1, enqueued_s=0.0), Item(1, enqueued_s=0.004)]
    assert plan_batch(queue, 0.004, cfg()) == Wait(0.005)
    plan = plan_batch(queue, 0.005, cfg())
    assert isinstance(plan, Dispatch) and plan.rows == 2


def test_flush_sends_at_once_when_draining() -> None:
    plan = plan_batch([Item(1)], 0.0, cfg(), flush=True)
    assert isinstance(plan, Dispatch) and plan.reason == "drain"


# -- assemble / split: padding and splitting --------------------------------------------------

def test_assemble_concatenates_and_pads_rows_for_a_static_batch() -> None:
    loop = asyncio.new_event_loop()
    try:

        def pending(inputs: dict[str, Any]) -> PendingRequest:
            return PendingRequest(inputs=inputs, rows=inputs["x"].shape[0],
                                  signature=signature_of(inputs), enqueued_s=0, deadline_s=1,
                                  future=loop.create_future())

        a, b = pending(rows(1)), pending(rows(2, start=100))
        batch, n = assemble([a, b], pad_to=8)
        assert n == 3 and batch["x"].shape == (8, 4)
        assert np.array_equal(batch["x"][:3], np.concatenate([a.inputs["x"], b.inputs["x"]]))
        assert not batch["x"][3:].any()
        single, n = assemble([a], pad_to=None)
        assert n == 1 and single["x"] is a.inputs["x"]
    finally:
        loop.close()


@pytest.mark.parametrize("features", [4, 300_000])  # small: copied under the GIL; > 1 MiB: numpy
def test_assemble_copies_every_input_in_order_whatever_its_layout(features: int) -> None:
    loop = asyncio.new_event_loop()
    try:

        def pending(n: int, start: int) -> PendingRequest:
            # a non-contiguous float input and an integer one: both must arrive intact
            wide = np.arange(start, start + 2 * n * features, dtype=np.float32)
            inputs: dict[str, Any] = {"x": wide.reshape(n, 2 * features)[:, ::2],
                      "k": np.full((n, 3), start, dtype=np.int64)}
            return PendingRequest(inputs=inputs, rows=n, signature=signature_of(inputs),
                                  enqueued_s=0, deadline_s=1, future=loop.create_future())

        requests = [pending(1, 0), pending(2, 10**6), pending(3, 2 * 10**6)]
        batch, n = assemble(requests, pad_to=8)
        assert n == 6
        for name in ("x", "k"):
            parts = [r.inputs[name] for r in requests]
            expected = np.concatenate([*parts, np.zeros((2, *parts[0].shape[1:]),
                                                        dtype=parts[0].dtype)])
            assert batch[name].dtype == expected.dtype
            assert np.array_equal(batch[name], expected)
            assert batch[name].flags.c_contiguous and batch[name].flags.writeable
    finally:
        loop.close()


def test_split_outputs_gives_each_request_its_rows_and_drops_padding() -> None:
    out = {"y": np.arange(8).reshape(8, 1)}
    pieces = split_outputs(out, [1, 2], batch_rows=8)
    assert [p["y"].ravel().tolist() for p in pieces] == [[0], [1, 2]]


def test_split_outputs_rejects_an_output_without_the_batch_rows() -> None:
    with pytest.raises(BackendFailed, match="'y' has shape \\[2\\]"):
        split_outputs({"y": np.zeros(2)}, [3], batch_rows=3)


# -- the running batcher ---------------------------------------------------------------------

Scenario = Callable[[DynamicBatcher, FakeClock, FakeBackend, Recorder], Awaitable[None]]


def run(scenario: Scenario, *, backend: FakeBackend | None = None, **overrides: Any) -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        fake = backend or FakeBackend()
        recorder = Recorder()
        batcher = DynamicBatcher(fake, cfg(**overrides), clock=clock, observer=recorder,
                                 executor=InlineExecutor())
        batcher.start()
        try:
            await scenario(batcher, clock, fake, recorder)
        finally:
            await asyncio.wait_for(batcher.stop(), timeout=5)

    asyncio.run(main())


def test_batch_goes_when_it_reaches_max_batch_size_without_waiting() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        futures = [b.submit(rows(1, start=i)) for i in range(4)]
        await settle()
        assert backend.batches == [4]
        assert all(f.done() for f in futures)
        assert clock.now() == 0.0  # no time passed

    run(scenario)


def test_partial_batch_goes_when_the_oldest_request_has_waited_the_delay() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        first = b.submit(rows(1))
        clock.advance(0.003)
        await settle()
        second = b.submit(rows(1))  # arrives later: must not restart the delay
        clock.advance(0.0019)
        await settle()
        assert backend.batches == [] and not first.done()
        clock.advance(0.0001)  # 5 ms after the FIRST request's enqueue
        await settle()
        assert backend.batches == [2]
        assert first.done() and second.done()
        assert rec.waits == pytest.approx([0.005, 0.002])

    run(scenario)


def test_delay_counts_from_enqueue_even_while_every_slot_was_busy() -> None:
    """A request queued behind a long batch goes as soon as the slot frees, not +delay."""
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        backend = FakeBackend()
        executor = ManualExecutor()
        batcher = DynamicBatcher(backend, cfg(), clock=clock, executor=executor)
        batcher.start()
        batcher.submit(rows(4))  # a full batch: dispatched, computing until we finish it
        await settle()
        late = batcher.submit(rows(1))
        clock.advance(0.010)  # its delay passes while the only slot is busy
        await settle()
        assert len(executor.pending) == 1 and not late.done()
        executor.finish_next()
        await settle()
        assert len(executor.pending) == 1  # dispatched at once: no second 5 ms wait
        executor.finish_next()
        await settle()
        assert late.done() and backend.batches == [4, 1]
        await batcher.stop()

    asyncio.run(main())


def test_results_go_back_to_the_right_requests() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        a = b.submit(rows(1, start=0))
        c = b.submit(rows(3, start=100))
        await settle()
        assert backend.batches == [4]
        assert np.array_equal(a.result()["y"], rows(1, start=0)["x"] * 2)
        assert np.array_equal(c.result()["y"], rows(3, start=100)["x"] * 2)
        assert c.result()["total"].shape == (3, 1)

    run(scenario)


def test_queue_full_rejects_at_once_with_retry_after() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        for i in range(2):
            b.submit(rows(1, start=i))
        with pytest.raises(QueueFull) as raised:
            b.submit(rows(1))
        assert raised.value.status == 503 and raised.value.retry_after_s == 3
        assert rec.outcomes == {"rejected": 1}
        clock.advance(0.005)
        await settle()
        assert backend.batches == [2]

    run(scenario, max_queue_size=2, retry_after_s=3)


def test_timed_out_requests_get_504_and_are_never_computed() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        short = b.submit(rows(1), timeout_s=0.002)
        long = b.submit(rows(1), timeout_s=10.0)  # capped at the 1 s default
        clock.advance(0.002)
        await settle()
        assert isinstance(short.exception(), RequestTimedOut)
        assert short.exception().status == 504  # type: ignore[union-attr]
        clock.advance(0.003)
        await settle()
        assert backend.batches == [1] and long.done() and long.exception() is None
        assert rec.outcomes == {"timeout": 1, "ok": 1}

    run(scenario, max_queue_delay_s=0.005)


def test_timeout_is_capped_at_the_server_default() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        gate_closed = b.submit(rows(1), timeout_s=60.0)
        clock.advance(0.9)
        await settle()
        assert not gate_closed.done()
        clock.advance(0.1)
        await settle()
        assert isinstance(gate_closed.exception(), RequestTimedOut)

    run(scenario, max_queue_delay_s=5.0, default_timeout_s=1.0)


def test_cancelled_requests_are_dropped_before_compute() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        gone = b.submit(rows(1, start=0))
        kept = b.submit(rows(1, start=50))
        gone.cancel()  # what a cancelled handler does to the future it awaits
        await settle()
        assert b.depth == 1
        clock.advance(0.005)
        await settle()
        assert backend.batches == [1]
        assert np.array_equal(backend.batch_inputs[0]["x"], rows(1, start=50)["x"])
        assert kept.result()["y"].shape == (1, 4)
        assert rec.outcomes == {"cancelled": 1, "ok": 1}

    run(scenario)


def test_requests_whose_connection_closed_are_dropped_when_the_batch_forms() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        closed = {"value": False}
        b.submit(rows(1), client_gone=lambda: closed["value"])
        b.submit(rows(1, start=9))
        closed["value"] = True
        clock.advance(0.005)
        await settle()
        assert backend.batches == [1]
        assert rec.outcomes == {"cancelled": 1, "ok": 1}

    run(scenario)


def test_backend_exception_fails_only_its_batch_and_serving_continues() -> None:
    backend = FakeBackend(fail_when=lambda inputs: bool(inputs["x"][0, 0] == 666))

    async def scenario(b: DynamicBatcher, clock: FakeClock, fake: FakeBackend,
                       rec: Recorder) -> None:
        doomed = [b.submit(rows(1, start=666)), b.submit(rows(1))]
        clock.advance(0.005)
        await settle()
        for f in doomed:
            error = f.exception()
            assert isinstance(error, BackendFailed) and error.status == 500
            assert "injected backend failure" in error.message
        fine = b.submit(rows(4, start=1))
        await settle()
        assert fine.result()["y"].shape == (4, 4)
        assert rec.outcomes == {"error": 2, "ok": 1}

    run(scenario, backend=backend)


def test_different_shapes_are_split_into_separate_batches() -> None:
    backend = FakeBackend(dynamic_features=True)

    async def scenario(b: DynamicBatcher, clock: FakeClock, fake: FakeBackend,
                       rec: Recorder) -> None:
        narrow = [b.submit(rows(1, features=4, start=i)) for i in range(2)]
        wide = b.submit(rows(1, features=8))
        narrow.append(b.submit(rows(1, features=4, start=7)))
        clock.advance(0.005)
        await settle()
        assert [x["x"].shape for x in fake.batch_inputs] == [(3, 4), (1, 8)]
        assert wide.result()["y"].shape == (1, 8)
        assert all(f.result()["y"].shape == (1, 4) for f in narrow)

    run(scenario, backend=backend)


def test_static_batch_backend_gets_padded_batches() -> None:
    backend = FakeBackend(static_batch_size=4)

    async def scenario(b: DynamicBatcher, clock: FakeClock, fake: FakeBackend,
                       rec: Recorder) -> None:
        single = b.submit(rows(1, start=3))
        clock.advance(0.005)
        await settle()
        assert fake.batches == [4]
        assert np.array_equal(single.result()["y"], rows(1, start=3)["x"] * 2)
        assert rec.batches == [1]  # the metric counts real rows, not padding

    run(scenario, backend=backend)


@pytest.mark.parametrize(("inputs", "message"), [
    ({"x": np.zeros((5, 4), np.float32)}, "more than the max batch size 4"),
    ({}, "no inputs"),
    ({"x": np.zeros((1, 4), np.float32), "z": np.zeros((2, 4), np.float32)}, "disagree"),
])
def test_submit_rejects_requests_that_cannot_be_batched(inputs: dict[str, Any],
                                                        message: str) -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        with pytest.raises(InvalidRequest, match=message):
            b.submit(inputs)

    run(scenario)


def test_stop_serves_everything_queued_then_refuses_new_requests() -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        batcher = DynamicBatcher(FakeBackend(), cfg(max_queue_delay_s=60.0), clock=clock,
                                 executor=InlineExecutor())
        batcher.start()
        futures = [batcher.submit(rows(1, start=i)) for i in range(6)]
        await settle()
        stopping = asyncio.create_task(batcher.stop())
        await settle()
        with pytest.raises(ShuttingDown):
            batcher.submit(rows(1))
        await asyncio.wait_for(stopping, timeout=5)  # no fake-clock advance needed: drain flushes
        assert all(f.result()["y"].shape == (1, 4) for f in futures)

    asyncio.run(main())


def test_concurrent_batches_are_bounded_by_the_slots() -> None:
    """With real threads: two slots, a gated backend -> two batches compute, one full batch
    waits handed ahead to the executor, the rest stay queued."""
    import threading

    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    lock = threading.Lock()
    running = {"now": 0, "most": 0}
    infer = backend.infer

    def counted(inputs: Any) -> dict[str, Any]:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        try:
            return infer(inputs)
        finally:
            with lock:
                running["now"] -= 1

    backend.infer = counted  # type: ignore[method-assign]

    async def main() -> None:
        # Real threads and the real clock: generous deadlines, so a slow machine only waits.
        batcher = DynamicBatcher(backend, cfg(max_concurrent_batches=2, max_queue_delay_s=0.0,
                                              default_timeout_s=30.0))
        batcher.start()
        futures = [batcher.submit(rows(4, start=i)) for i in range(5)]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            if running["now"] == 2 and batcher.inflight_batches == 3:
                break
        assert batcher.inflight_batches == 3 and batcher.depth == 3  # 1 ahead + 2 queued
        gate.set()
        await asyncio.wait_for(asyncio.gather(*futures), timeout=5)
        await batcher.stop()
        assert backend.batches == [4] * 5 and running["most"] == 2

    asyncio.run(main())


def test_a_full_batch_is_handed_ahead_while_the_slot_is_busy_a_partial_one_is_not() -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        backend = FakeBackend()
        executor = ManualExecutor()
        batcher = DynamicBatcher(backend, cfg(), clock=clock, executor=executor)
        batcher.start()
        first = batcher.submit(rows(4, start=0))
        await settle()
        second = [batcher.submit(rows(2, start=10 + i)) for i in range(2)]  # full: 4 rows
        partial = batcher.submit(rows(1, start=50))
        clock.advance(0.010)  # the partial one's delay has passed, but no slot is free
        await settle()
        # 1 computing, 1 full batch handed ahead; the partial one stays queued. (The manual
        # executor starts nothing until told, so all 4 requests still count as waiting.)
        assert len(executor.pending) == 2 and batcher.depth == 4
        executor.finish_next()
        await settle()
        # the batch handed ahead now holds the slot; the partial one waits for it to free
        assert first.done() and len(executor.pending) == 1 and batcher.depth == 3
        executor.finish_next()
        await settle()
        assert all(f.done() for f in second) and len(executor.pending) == 1
        executor.finish_next()
        await settle()
        assert backend.batches == [4, 4, 1] and partial.result()["y"].shape == (1, 4)
        await batcher.stop()

    asyncio.run(main())


def test_depth_stops_counting_requests_that_expire_or_leave_before_their_batch_starts() -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        executor = ManualExecutor()
        batcher = DynamicBatcher(FakeBackend(), cfg(), clock=clock, executor=executor)
        batcher.start()
        batcher.submit(rows(4, start=0))
        await settle()
        short = batcher.submit(rows(1, start=100), timeout_s=0.050)
        gone = batcher.submit(rows(1, start=200))
        batcher.submit(rows(2, start=300))  # 4 rows: handed ahead, not started
        await settle()
        assert len(executor.pending) == 2 and batcher.depth == 4
        gone.cancel()
        await settle()
        assert batcher.depth == 3
        clock.advance(0.060)  # short's deadline passes while it waits in the executor
        await settle()
        assert short.done() and batcher.depth == 2
        executor.finish_next()
        executor.finish_next()
        await settle()
        assert batcher.depth == 0
        await batcher.stop()

    asyncio.run(main())


def test_requests_handed_ahead_are_checked_again_when_their_batch_starts() -> None:
    async def main() -> None:
        clock = FakeClock(start_s=0.0)
        backend = FakeBackend()
        recorder = Recorder()
        executor = ManualExecutor()
        batcher = DynamicBatcher(backend, cfg(), clock=clock, executor=executor,
                                 observer=recorder)
        batcher.start()
        batcher.submit(rows(4, start=0))
        await settle()
        short = batcher.submit(rows(1, start=100), timeout_s=0.050)
        gone = batcher.submit(rows(1, start=200))
        kept = batcher.submit(rows(2, start=300))  # 4 rows: handed ahead
        await settle()
        assert len(executor.pending) == 2 and batcher.depth == 4  # none started yet
        gone.cancel()
        clock.advance(0.060)  # short's deadline passes while it waits in the executor
        executor.finish_next()
        executor.finish_next()
        await settle()
        assert isinstance(short.exception(), RequestTimedOut)
        assert "waiting for its batch to start" in short.exception().message  # type: ignore[union-attr]
        assert kept.result()["y"].shape == (2, 4)
        assert backend.batches == [4, 2]  # neither the expired nor the cancelled one computed
        assert recorder.outcomes == {"ok": 2, "timeout": 1, "cancelled": 1}
        assert recorder.waits[-1] == pytest.approx(0.060)  # queue wait runs to compute start
        await batcher.stop()

    asyncio.run(main())


def test_fail_pending_answers_whatever_a_timed_out_drain_left() -> None:
    async def scenario(b: DynamicBatcher, clock: FakeClock, backend: FakeBackend,
                       rec: Recorder) -> None:
        waiting = [b.submit(rows(1, start=i)) for i in range(2)]
        assert b.fail_pending(ShuttingDown("shut down first", retry_after_s=1)) == 2
        assert all(isinstance(f.exception(), ShuttingDown) for f in waiting)
        assert b.depth == 0

    run(scenario, max_queue_delay_s=60.0)
