"""The dynamic batcher: queued requests -> batches -> backend, with Triton's semantics.

A batch is dispatched when, looking at the queue from its oldest request:

1. the requests compatible with the oldest one reach ``max_batch_size`` rows (or the next
   compatible request would not fit), or
2. a prefix of them sums to one of ``preferred_batch_sizes`` (the largest such prefix goes), or
3. the **oldest** request has waited ``max_queue_delay_s`` since *its own* enqueue — not since a
   worker last looked — so a request's added latency is bounded by the delay, however busy
   the workers were, or
4. the batcher is draining (shutdown): nothing more will arrive, so nothing waits.

and only while one of ``max_concurrent_batches`` slots is free; while every slot is busy,
arrivals accumulate and the next batch is larger, which is what makes batching pay.

One exception keeps the model busy: while every slot is busy, a batch that is already *full*
(trigger 1 or 2: waiting cannot make it bigger) is handed to the executor ahead of time, one
at most, so a worker starts it the moment its current batch ends instead of after a round trip
through the event loop (two thread wake-ups, each up to a millisecond on a busy VM; measured
on 2 vCPUs with 12.5 ms batches: a 3.2 ms median gap between batches, 0.3 ms handed ahead).
Until it starts, its requests still count as waiting (queue bound, ``depth``), expire at their
deadline (504) and are dropped when their client leaves; the worker checks again as it starts.

Other guarantees:

- The queue is bounded: :meth:`DynamicBatcher.submit` raises :class:`QueueFull` at once.
- Each request has a deadline (its timeout, capped at the default); one that passes while the
  request is queued fails it with :class:`RequestTimedOut` without computing it. Deadlines are
  kept in a heap so expiry costs O(log n), not a scan per arrival.
- A request whose client has gone (its future was cancelled, or ``client_gone()`` says so) is
  dropped before compute, both while queued and again when its batch is assembled.
- An exception from the backend fails only that batch's requests (:class:`BackendFailed`); the
  loop keeps serving.
- Compute runs in an executor (a thread pool by default), so the event loop stays responsive;
  so do the copies that build a batch and the slicing that splits its outputs.

Shapes: requests are batched along dimension 0. Requests whose other dimensions or dtypes differ
are **split** into separate batches (grouped by a shape signature, FIFO within each group, the
oldest request's group first) rather than padded: padding an image or feature dimension with
zeros changes a convolutional model's output, so it would not be correct. Padding is used only
along the batch dimension, when the backend's graph has a fixed batch size: rows are zero-filled
up to it and the padded rows' outputs discarded. Outputs are split back per request by row
offsets, so a request of 3 rows gets exactly its 3 rows back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import structlog

from serving.backends.base import Array, Backend
from serving.clock import Clock, MonotonicClock
from serving.config import BatcherConfig
from serving.errors import (
    BackendFailed,
    InvalidRequest,
    QueueFull,
    RequestTimedOut,
    ShuttingDown,
    Unavailable,
)

log = structlog.get_logger("serving.batcher")

# (input name, dtype, shape without the batch dimension) for each input, sorted by name.
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]

# A request is QUEUED, then DISPATCHED (handed to the executor with its batch, which may not
# have started yet), then FINISHED (answered, or dropped, on the event loop).
QUEUED, DISPATCHED, FINISHED = "queued", "dispatched", "finished"


class Queued(Protocol):
    """What batch planning needs to know about a queued request."""

    @property
    def rows(self) -> int: ...

    @property
    def signature(self) -> Signature: ...

    @property
    def enqueued_s(self) -> float: ...


class BatchObserver(Protocol):
    """Where the batcher reports what it did (the Prometheus metrics implement this)."""

    def queue_depth(self, depth: int) -> None: ...

    def outcome(self, outcome: str, count: int = 1) -> None: ...

    def batch(self, rows: int, queue_waits_s: Sequence[float], compute_s: float) -> None: ...


class NullObserver:
    def queue_depth(self, depth: int) -> None:
        pass

    def outcome(self, outcome: str, count: int = 1) -> None:
        pass

    def batch(self, rows: int, queue_waits_s: Sequence[float], compute_s: float) -> None:
        pass


def _never_gone() -> bool:
    return False


@dataclass(eq=False)
class BatchStart:
    """Set by the executor's worker when a dispatched batch begins (read on the loop); what
    ``depth`` counts of it until then."""

    started: bool = False
    # its requests not yet finished (expired or dropped) while it has not started; written on
    # the loop only, so ``depth`` need not walk the batch
    unanswered: int = 0


@dataclass(eq=False, slots=True)
class PendingRequest:
    """One admitted request: its inputs, deadline and the future its handler awaits."""

    inputs: Mapping[str, Array]
    rows: int
    signature: Signature
    enqueued_s: float
    deadline_s: float
    future: asyncio.Future[dict[str, Array]]
    client_gone: Callable[[], bool] = _never_gone
    state: str = QUEUED
    seq: int = 0
    batch: BatchStart | None = None  # set when dispatched

    def abandoned(self) -> bool:
        """The caller no longer wants the answer (handler cancelled or connection closed)."""
        return self.future.done() or self.client_gone()

    def finish_waiting(self) -> None:
        """Finished without computing (expired, or dropped) while :meth:`waiting`."""
        if self.state == DISPATCHED and self.batch is not None:
            self.batch.unanswered -= 1
        self.state = FINISHED

    def waiting(self) -> bool:
        """Not computing yet: queued, or dispatched in a batch that has not started. Such a
        request can still expire (504) or be dropped (client gone) without being computed."""
        return self.state == QUEUED or (
            self.state == DISPATCHED and self.batch is not None and not self.batch.started)


@dataclass(eq=False)
class _Dispatched:
    """A batch handed to the executor: computing, or waiting for a worker."""

    requests: list[PendingRequest]
    start: BatchStart



@dataclass(frozen=True)
class Dispatch:
    """Send these requests now, as one batch; ``reason`` is for logs and tests."""

    requests: tuple[Queued, ...]
    rows: int
    reason: str


@dataclass(frozen=True)
class Wait:
    """Nothing to send yet; look again at ``until_s`` (or on the next arrival)."""

    until_s: float


def signature_of(inputs: Mapping[str, Array]) -> Signature:
    if len(inputs) == 1:  # the common case, without the sort
        for name, a in inputs.items():
            return ((name, a.dtype.str, a.shape[1:]),)
    return tuple(sorted((name, a.dtype.str, a.shape[1:]) for name, a in inputs.items()))


def plan_batch(queue: Iterable[Queued], now_s: float, config: BatcherConfig, *,
               flush: bool = False) -> Dispatch | Wait | None:
    """Decide, from the queue alone, whether a batch goes now (pure; see the module doc)."""
    it = iter(queue)
    head = next(it, None)
    if head is None:
        return None
    chosen: list[Queued] = [head]
    rows = head.rows
    full = rows >= config.max_batch_size
    if not full:
        for item in it:
            if item.signature != head.signature:
                continue  # other shapes form their own batches (split, never padded)
            if rows + item.rows > config.max_batch_size:
                full = True  # the next compatible request does not fit: waiting can't help
                break
            chosen.append(item)
            rows += item.rows
            if rows == config.max_batch_size:
                full = True
                break
    if full:
        return Dispatch(tuple(chosen), rows, "max_batch_size")
    if config.preferred_batch_sizes:
        prefix_rows = list(itertools.accumulate(r.rows for r in chosen))
        for size in sorted(config.preferred_batch_sizes, reverse=True):
            if size in prefix_rows:
                n = prefix_rows.index(size) + 1
                return Dispatch(tuple(chosen[:n]), size, "preferred_batch_size")
    if flush:
        return Dispatch(tuple(chosen), rows, "drain")
    due_s = head.enqueued_s + config.max_queue_delay_s
    if now_s >= due_s:
        return Dispatch(tuple(chosen), rows, "max_queue_delay")
    return Wait(due_s)


# A batch input up to this size is copied together holding the GIL (:func:`assemble`); a
# larger one lets the event loop run while numpy copies it.
_GIL_HELD_COPY_BYTES = 1 << 20


def assemble(requests: Sequence[PendingRequest],
             pad_to: int | None) -> tuple[dict[str, Array], int]:
    """Concatenate requests' inputs along dim 0 (zero-padding rows up to ``pad_to``)."""
    rows = sum(r.rows for r in requests)
    names = [name for name, _, _ in requests[0].signature]
    padding = (pad_to - rows) if pad_to is not None and pad_to > rows else 0
    if len(requests) == 1 and not padding:
        return dict(requests[0].inputs), rows
    batch: dict[str, Array] = {}
    for name in names:
        parts = [r.inputs[name] for r in requests]
        first = parts[0]
        if padding:
            parts.append(np.zeros((padding, *first.shape[1:]), dtype=first.dtype))
        size = sum(part.nbytes for part in parts)
        if size > _GIL_HELD_COPY_BYTES:
            batch[name] = np.concatenate(parts, axis=0)
            continue
        # Small: copied holding the GIL. np.concatenate lets the GIL go around each part's
        # copy, and with the event loop busy on the other core every release hands the GIL
        # to the loop and back (a futex wake and a context switch each, several per request
        # of the batch), which cost more than the copies themselves.
        joined = np.empty((rows + padding, *first.shape[1:]), dtype=first.dtype)
        into = joined.data.cast("B")
        offset = 0
        for part in parts:
            data = np.ascontiguousarray(part).data.cast("B")
            into[offset:offset + data.nbytes] = data
            offset += data.nbytes
        batch[name] = joined
    return batch, rows


def split_outputs(outputs: Mapping[str, Array], rows_per_request: Sequence[int],
                  batch_rows: int) -> list[dict[str, Array]]:
    """Cut each output along dim 0 back into per-request pieces (padding rows are dropped)."""
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] < batch_rows:
            raise BackendFailed(f"model output {name!r} has shape {list(value.shape)}; expected "
                                f"{batch_rows} rows along dimension 0")
    pieces: list[dict[str, Array]] = []
    offset = 0
    for rows in rows_per_request:
        pieces.append({name: value[offset:offset + rows] for name, value in outputs.items()})
        offset += rows
    return pieces


@dataclass
class _Deadlines:
    """Min-heap of (deadline, seq, request); entries of requests no longer waiting (computing
    or answered) are skipped."""

    heap: list[tuple[float, int, PendingRequest]] = field(default_factory=list)

    def push(self, request: PendingRequest) -> None:
        heapq.heappush(self.heap, (request.deadline_s, request.seq, request))

    def next_s(self) -> float | None:
        while self.heap and not self.heap[0][2].waiting():
            heapq.heappop(self.heap)
        return self.heap[0][0] if self.heap else None

    def pop_due(self, now_s: float) -> list[PendingRequest]:
        due: list[PendingRequest] = []
        while self.heap and (not self.heap[0][2].waiting() or self.heap[0][0] <= now_s):
            _, _, request = heapq.heappop(self.heap)
            if request.waiting():
                due.append(request)
        return due


class DynamicBatcher:
    """Groups requests into batches for one backend. ``start()``, ``submit()``, ``stop()``.

    All methods are called on the event loop's thread; only ``backend.infer`` runs elsewhere.
    """

    def __init__(self, backend: Backend, config: BatcherConfig, *, clock: Clock | None = None,
                 observer: BatchObserver | None = None,
                 executor: concurrent.futures.Executor | None = None) -> None:
        self._backend = backend
        self._config = config.validate()
        self._clock: Clock = clock or MonotonicClock()
        self._observer: BatchObserver = observer or NullObserver()
        self._own_executor = executor is None
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=config.max_concurrent_batches, thread_name_prefix="gpufrag-batch")
        self._pad_to = backend.static_batch_size
        self._queue: deque[PendingRequest] = deque()
        self._deadlines = _Deadlines()
        self._seq = itertools.count()
        # batches handed to the executor (computing, or waiting for a worker), by the future
        # of their computation
        self._inflight: dict[asyncio.Future[_Computed], _Dispatched] = {}
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop start() ran on
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.Task[None] | None = None
        self._timer_at: float | None = None
        self._accepting = False
        self._draining = False
        self._abandoned_dirty = False

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def config(self) -> BatcherConfig:
        return self._config

    @property
    def accepting(self) -> bool:
        return self._accepting

    def start(self) -> None:
        """Start the batching loop on the running event loop; admission opens."""
        if self._task is not None:
            raise RuntimeError("batcher already started")
        self._wake = asyncio.Event()
        self._accepting = True
        # kept: asyncio.get_running_loop() makes a getpid() system call each time (CPython
        # checks for a fork), once per request in submit()
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="gpufrag-batcher")

    def close_admission(self) -> None:
        """New submissions fail with :class:`ShuttingDown`; queued ones are still served."""
        self._accepting = False

    async def stop(self) -> None:
        """Close admission, serve everything queued or computing (without waiting out the queue
        delay), then stop the loop. No accepted request is left unanswered."""
        self.close_admission()
        self._draining = True
        if self._task is None:
            return
        self._poke()
        await asyncio.shield(self._task)
        if self._timer is not None:
            self._timer.cancel()
        if self._own_executor:
            self._executor.shutdown(wait=False)

    def fail_pending(self, error: Exception) -> int:
        """Fail every queued request with ``error`` (used when a drain runs out of time)."""
        failed = 0
        while self._queue:
            request = self._queue.popleft()
            request.state = FINISHED
            if not request.future.done():
                request.future.set_exception(error)
                failed += 1
        self._poke()
        return failed

    @property
    def depth(self) -> int:
        """Requests waiting to compute: queued, or handed ahead in a batch not yet started."""
        queued = len(self._queue)
        if not self._inflight:  # the common case on the hot path: nothing to walk
            return queued
        for dispatched in self._inflight.values():
            start = dispatched.start
            if not start.started:
                queued += start.unanswered
        return queued

    def admission_error(self) -> Unavailable | None:
        """Why a request would be refused now (closed, or the queue is full), or None. The
        HTTP layer asks before reading a body, so shedding load costs no parsing."""
        return self._refusal(self.depth)

    def _refusal(self, depth: int) -> Unavailable | None:
        config = self._config
        if not self._accepting:
            return ShuttingDown("server is not accepting requests (starting or shutting down)",
                                retry_after_s=config.retry_after_s)
        if depth >= config.max_queue_size:
            return QueueFull(f"queue is full ({depth} requests waiting, --max-queue-size "
                             f"{config.max_queue_size}); retry after {config.retry_after_s}s",
                             retry_after_s=config.retry_after_s)
        return None

    def _timeout(self, timeout_s: float | None) -> float:
        default = self._config.default_timeout_s
        return default if timeout_s is None else min(timeout_s, default)

    @property
    def inflight_batches(self) -> int:
        return len(self._inflight)

    # -- admission ---------------------------------------------------------------------------

    def submit(self, inputs: Mapping[str, Array], *, timeout_s: float | None = None,
               client_gone: Callable[[], bool] | None = None
               ) -> asyncio.Future[dict[str, Array]]:
        """Queue one request; the returned future resolves to its outputs (or a ServingError).

        Raises at once (never queues) when admission is closed or the queue is full, and for a
        request with more rows than ``max_batch_size`` or inconsistent batch dimensions.
        """
        config = self._config
        depth = self.depth
        refused = self._refusal(depth)
        if refused is not None:
            self._observer.outcome(refused.outcome)
            raise refused
        rows = _rows_of(inputs)
        if rows > config.max_batch_size:
            raise InvalidRequest(f"request has {rows} rows along dimension 0, more than the max "
                                 f"batch size {config.max_batch_size}; split it")
        timeout = self._timeout(timeout_s)
        now = self._clock.now()
        assert self._loop is not None  # (admission is open: started)
        future: asyncio.Future[dict[str, Array]] = self._loop.create_future()
        request = PendingRequest(inputs, rows, signature_of(inputs), now, now + timeout, future,
                                 client_gone or _never_gone, QUEUED, next(self._seq))
        future.add_done_callback(self._on_future_done)
        self._queue.append(request)
        self._deadlines.push(request)
        self._observer.queue_depth(depth + 1)  # (self.depth, with this request queued)
        self._poke()
        return future

    def _on_future_done(self, future: asyncio.Future[dict[str, Array]]) -> None:
        if future.cancelled():  # the handler went away: purge it from the queue soon
            self._abandoned_dirty = True
            self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        slots = self._config.max_concurrent_batches
        while True:
            now = self._clock.now()
            self._expire(now)
            if self._abandoned_dirty:
                self._drop_abandoned()
            self._observer.queue_depth(self.depth)
            wake_at = self._deadlines.next_s()
            busy = len(self._inflight)
            if self._queue and busy <= slots:  # a free slot, or room to hand one full batch ahead
                plan = plan_batch(self._queue, now, self._config, flush=self._draining)
                if isinstance(plan, Dispatch) and (busy < slots or plan.reason in _FULL):
                    self._dispatch([r for r in plan.requests if isinstance(r, PendingRequest)])
                    continue
                if isinstance(plan, Wait) and busy < slots:
                    wake_at = plan.until_s if wake_at is None else min(wake_at, plan.until_s)
            if self._draining and not self._queue and not self._inflight:
                return
            self._arm_timer(wake_at)
            self._wake.clear()
            await self._wake.wait()

    def _dispatch(self, batch: list[PendingRequest]) -> None:
        """Hand ``batch`` to the executor now (it starts as soon as a worker is free)."""
        dispatched = _Dispatched(batch, self._take(batch))
        assert self._loop is not None
        computed = self._loop.run_in_executor(self._executor, self._compute, dispatched)
        self._inflight[computed] = dispatched
        # a callback, not a task per batch: answered as soon as the loop sees the result
        computed.add_done_callback(lambda done: self._finish(batch, done))

    def _arm_timer(self, at_s: float | None) -> None:
        """Make sure the loop wakes by ``at_s``. A timer already set for that time or earlier
        is kept: ringing early costs one pass of the loop, which then arms the next one, while
        replacing it would cost a task per request (each new request's deadline is later than
        the one before)."""
        timer_at = self._timer_at
        if (self._timer is not None and not self._timer.done() and timer_at is not None
                and (at_s is None or timer_at <= at_s)):
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at_s
        if at_s is not None:
            assert self._loop is not None
            self._timer = self._loop.create_task(self._ring(at_s))

    async def _ring(self, at_s: float) -> None:
        await self._clock.sleep_until(at_s)
        self._poke()

    def _expire(self, now_s: float) -> None:
        due = self._deadlines.pop_due(now_s)
        if not due:
            return
        expired = {id(r) for r in due if r.state == QUEUED}
        if expired:
            self._queue = deque(r for r in self._queue if id(r) not in expired)
        for request in due:
            request.finish_waiting()
            if request.future.done():
                self._observer.outcome("cancelled")
                continue
            waited_ms = (now_s - request.enqueued_s) * 1000
            request.future.set_exception(RequestTimedOut(
                f"request timed out after {waited_ms:.0f} ms in the queue (deadline "
                f"{(request.deadline_s - request.enqueued_s) * 1000:.0f} ms); not computed"))
            self._observer.outcome(RequestTimedOut.outcome)

    def _drop_abandoned(self) -> None:
        self._abandoned_dirty = False
        keep: deque[PendingRequest] = deque()
        for request in self._queue:
            if request.abandoned():
                request.state = FINISHED
                self._observer.outcome("cancelled")
            else:
                keep.append(request)
        self._queue = keep
        for dispatched in self._inflight.values():  # dispatched, not started: drop it there too
            for request in dispatched.requests:
                if request.waiting() and request.abandoned():
                    request.finish_waiting()
                    self._observer.outcome("cancelled")

    def _take(self, batch: Sequence[PendingRequest]) -> BatchStart:
        n = len(batch)
        if all(self._queue[i] is batch[i] for i in range(n)):
            for _ in range(n):
                self._queue.popleft()
        else:
            taken = {id(r) for r in batch}
            self._queue = deque(r for r in self._queue if id(r) not in taken)
        start = BatchStart(unanswered=len(batch))
        for request in batch:
            request.state = DISPATCHED
            request.batch = start
        return start

    def _finish(self, batch: list[PendingRequest], computed: asyncio.Future[_Computed]) -> None:
        """``batch`` is back from the executor: free its slot (the next batch is planned
        before these answers are written; a drain waits for the last one to leave), then
        answer each of its requests."""
        self._inflight.pop(computed, None)
        self._poke()
        try:
            if computed.cancelled():
                raise RuntimeError("the batch's computation was cancelled")
            result = computed.result()
        except Exception as exc:  # a backend fault fails this batch only
            rows = sum(r.rows for r in batch)
            message = exc.message if isinstance(exc, BackendFailed) else (
                f"model failed on a batch of {rows}: {type(exc).__name__}: {exc}")
            log.error("batch_failed", rows=rows, requests=len(batch), error=message)
            for request in batch:
                if request.state == FINISHED:  # expired or dropped before it started
                    continue
                request.state = FINISHED
                if not request.future.done():
                    request.future.set_exception(BackendFailed(message))
                    self._observer.outcome(BackendFailed.outcome)
                else:
                    self._observer.outcome("cancelled")
            return
        for request in result.expired:
            if request.state == FINISHED:
                continue
            request.state = FINISHED
            if request.future.done():
                self._observer.outcome("cancelled")
                continue
            waited_ms = (result.started_s - request.enqueued_s) * 1000
            request.future.set_exception(RequestTimedOut(
                f"request timed out after {waited_ms:.0f} ms waiting for its batch to start "
                f"(deadline {(request.deadline_s - request.enqueued_s) * 1000:.0f} ms); "
                "not computed"))
            self._observer.outcome(RequestTimedOut.outcome)
        for request in result.dropped:
            if request.state != FINISHED:
                request.state = FINISHED
                self._observer.outcome("cancelled")
        if not result.live:
            return
        self._observer.batch(result.rows, [result.started_s - r.enqueued_s for r in result.live],
                             result.compute_s)
        for request, piece in zip(result.live, result.pieces, strict=True):
            if request.state == FINISHED:  # expired on the loop as its batch started: a race
                continue                   # of microseconds; it is answered once, with 504
            request.state = FINISHED
            if request.future.done():
                self._observer.outcome("cancelled")
            else:
                request.future.set_result(piece)
                self._observer.outcome("ok")

    def _compute(self, dispatched: _Dispatched) -> _Computed:
        """In the executor: mark the batch started (from here on the loop leaves its requests
        alone), skip those the loop already answered, set aside those that expired or whose
        client left while the batch waited (reads only: the loop owns every write), then
        concatenate, infer and cut the outputs back per request. Copying a batch's inputs
        together (megabytes for images) stays off the event loop's thread; a large one lets
        the loop run meanwhile (:func:`assemble`)."""
        dispatched.start.started = True
        started = self._clock.now()
        live, expired, dropped = [], [], []
        for request in dispatched.requests:
            if request.state == FINISHED:
                continue
            if request.abandoned():
                dropped.append(request)
            elif started >= request.deadline_s:
                expired.append(request)
            else:
                live.append(request)
        if not live:
            return _Computed(live, expired, dropped, [], 0, started, 0.0)
        inputs, rows = assemble(live, self._pad_to)
        began = self._clock.now()
        outputs = self._backend.infer(inputs)
        compute_s = self._clock.now() - began
        pieces = split_outputs(outputs, [r.rows for r in live], max(rows, self._pad_to or 0))
        return _Computed(live, expired, dropped, pieces, rows, started, compute_s)


# Dispatch reasons for a batch that waiting cannot make bigger: it may be handed ahead.
_FULL = frozenset({"max_batch_size", "preferred_batch_size"})


@dataclass(frozen=True)
class _Computed:
    """What a batch's trip through the executor produced."""

    live: list[PendingRequest]
    expired: list[PendingRequest]  # deadline passed before the batch started: 504
    dropped: list[PendingRequest]  # client gone before the batch started
    pieces: list[dict[str, Array]]
    rows: int
    started_s: float
    compute_s: float


def _rows_of(inputs: Mapping[str, Array]) -> int:
    if not inputs:
        raise InvalidRequest("request has no inputs")
    counts = [a.shape[0] if a.ndim else 0 for a in inputs.values()]
    n = counts[0]
    if n < 1 or counts.count(n) != len(counts):
        rows = {name: (a.shape[0] if a.ndim else 0) for name, a in inputs.items()}
        if counts.count(n) != len(counts):
            raise InvalidRequest(f"inputs disagree on the batch dimension (dim 0): {rows}")
        raise InvalidRequest(f"inputs need at least 1 row along dimension 0, got {rows}")
    return n
