"""Warning Events the extender puts on objects, off the watch: one per object and cause.

The causes: an object the cache cannot read and leaves out of the state (a quantity no
converter can use, a malformed field: ``GpufragUnreadable``), and the pod warnings other parts
make (:class:`~scheduler.kube.podwarning.PodWarning`: a GPU pod bound without the extender's
say, ``GpufragBypassed``; a pod that named another namespace's reservation owner,
``GpufragReservationRefused``). The watch hands each to :class:`SkipReporter`, which queues
it and returns at once, so a slow or failing API can never stall the watch. One writer thread
creates the Events (through :class:`scheduler.kube.binder.KubeEventWriter`, with the
extender's other writes); a full queue drops the report and counts it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Final

import structlog

from scheduler.kube.cache import SkippedObject
from scheduler.kube.errors import api_error
from scheduler.kube.events import Involved, is_duplicate, warning_event
from scheduler.kube.podwarning import (
    EVENT_REASON_BYPASSED,
    EVENT_REASON_RESERVATION_REFUSED,
    PodWarning,
)

log = structlog.get_logger("gpufrag.skipreport")

# The Warning Event put on an object the extender cannot read.
EVENT_REASON_UNREADABLE: Final = "GpufragUnreadable"
REPORTING_COMPONENT: Final = "gpufrag-extender"
# Reports waiting for the writer; one burst of bad objects past this is dropped (and counted).
EVENT_QUEUE_SIZE: Final = 256
# Objects (UIDs) already reported; past this the oldest may be reported again, which the
# deterministic Event name turns into a harmless 409 within its hour (scheduler.kube.events).
REMEMBERED_REPORTS: Final = 10_000
SKIP_EVENT_OUTCOMES: Final = ("written", "failed", "dropped")


# -------------------------------------------------------------------------------- skip reports
EventWrite = Callable[[str, dict[str, Any]], None]
"""Create one Event (namespace, body); raises what the API client raises."""

Report = SkippedObject | PodWarning
"""What a Warning Event is written about."""


def _identity(report: Report) -> str:
    """One per object and cause: an Event reason, the kind and the UID (or key)."""
    return f"{_event_reason(report)}/{report.kind}/{report.uid or report.key}"


def _event_reason(report: Report) -> str:
    return report.event_reason if isinstance(report, PodWarning) else EVENT_REASON_UNREADABLE


def _message(report: Report) -> str:
    if isinstance(report, PodWarning):
        return report.message
    return (f"gpufrag extender cannot read this {report.label} and leaves it out of its "
            f"cluster state: {report.reason}")


def skip_event(skipped: Report, *, instance: str, now_s: float
               ) -> tuple[str, dict[str, Any]]:
    """The namespace and body of the core/v1 Warning Event about one report
    (:func:`scheduler.kube.events.warning_event`: one name per object, cause and hour, so a
    restarted extender re-reporting it gets 409 AlreadyExists instead of a duplicate). A node's
    Event goes to ``default``, as the kubelet's do; the message is the reason (for an
    unreadable object the converter's, naming field and value), which is what the owner of the
    object needs to act on."""
    return warning_event(
        Involved(skipped.kind, skipped.name, skipped.namespace, skipped.uid),
        reason=_event_reason(skipped), message=_message(skipped),
        component=REPORTING_COMPONENT, instance=instance, now_s=now_s)


class SkipReporter:
    """Puts a Warning Event on each object the cache skips or finds bypassed, at most once per
    UID and cause.

    :meth:`report` is the cache's ``on_skip`` and its bypass watch's ``on_bypass``: it runs
    on a watch thread under the cache lock, so it only remembers the UID and queues (never
    waits); one writer thread (:meth:`start`)
    does the API calls. A report that finds the queue full is dropped; one whose write may pass
    on a retry (no answer, 429, 5xx) is forgotten again. Either way the object is reported
    at its next read (a status update, a relist). A refused write (403: RBAC without
    ``create events``) is not retried. ``outcomes`` counts ``written`` (409 AlreadyExists
    included: the Event is there), ``failed`` and ``dropped``."""

    def __init__(self, write: EventWrite, *, instance: str, clock: Callable[[], float] = time.time,
                 capacity: int = EVENT_QUEUE_SIZE, remember: int = REMEMBERED_REPORTS) -> None:
        self.write = write
        self.instance = instance
        self.clock = clock
        self.remember = remember
        self.outcomes = dict.fromkeys(SKIP_EVENT_OUTCOMES, 0)
        self._queue: queue.Queue[Report | None] = queue.Queue(maxsize=capacity)
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()  # _reported and outcomes: the watch and writer threads
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, skipped: Report) -> None:
        """Queue an Event for ``skipped`` unless it has been reported already."""
        identity = _identity(skipped)
        with self._lock:
            if identity in self._reported:
                return
            self._reported[identity] = None
            while len(self._reported) > self.remember:
                self._reported.popitem(last=False)
            try:
                self._queue.put_nowait(skipped)
            except queue.Full:
                self._reported.pop(identity, None)
                self.outcomes["dropped"] += 1
                log.debug("skip event dropped: queue full", object=identity)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def _forget(self, skipped: Report) -> None:
        with self._lock:
            self._reported.pop(_identity(skipped), None)

    def write_one(self, skipped: Report) -> None:
        """Write the Event for one report (the writer thread's step; tests call it directly)."""
        namespace, body = skip_event(skipped, instance=self.instance, now_s=self.clock())
        what = f"{skipped.label} {skipped.key}"
        try:
            self.write(namespace, body)
        except Exception as e:
            error = api_error(f"writing an Event on {what}", e)
            if is_duplicate(error):
                self._count("written")  # reported before (a restart): the Event is there
                return
            self._count("failed")
            if error is None:  # not the API refusing: a bug here; keep the trace
                log.exception("skip event not written", object=what)
                return
            if error.retryable:
                self._forget(skipped)
            log.warning("skip event not written", object=what, error=str(error),
                        retry_at_next_read=error.retryable)
            return
        self._count("written")
        log.info("skip event written", object=what, event_name=body["metadata"]["name"])

    def write_queued(self) -> int:
        """Write every queued report now, on this thread; returns how many (for tests)."""
        done = 0
        while True:
            try:
                skipped = self._queue.get_nowait()
            except queue.Empty:
                return done
            if skipped is not None:
                self.write_one(skipped)
                done += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            skipped = self._queue.get()
            if skipped is None or self._stop.is_set():
                return
            try:
                self.write_one(skipped)
            except Exception:  # the writer must outlive any one report
                log.exception("skip event writer failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="skip-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # wakes an idle writer; a busy one sees _stop
        if self._thread is not None:
            self._thread.join(timeout_s)




__all__ = ["EVENT_REASON_BYPASSED", "EVENT_REASON_RESERVATION_REFUSED", "EVENT_REASON_UNREADABLE",
           "REPORTING_COMPONENT",
           "SKIP_EVENT_OUTCOMES", "EventWrite", "Report", "SkipReporter", "skip_event"]
