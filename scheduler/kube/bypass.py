"""Noticing pods that gpufrag-scheduler placed without the extender's say.

kube-scheduler treats an extender marked ``ignorable: true`` as optional: when a filter call
fails or runs past ``httpTimeout`` it logs one line and places the pod with its own plugins
alone. For a GPU pod that means no fragmentation scoring, no model affinity and no GPU record,
and nobody would notice. A pod can also arrive bound without any scheduler (``spec.nodeName``
set by its creator). Either way the extender sees it in its watch: a GPU pod of its scheduler
that turned up bound to a node this extender did not pass for it, or that was bound while its
filter was still being answered. :class:`BypassWatch` counts such pods
(``gpufrag_extender_bypassed_pods_total``) and hands each to a listener, which puts a Warning
Event on it (:mod:`scheduler.kube.skipreport`).

Who is judged: only pods of this extender's scheduler that ask for a GPU, bound after the first
full list (a restart does not judge what was bound before it), and only by an extender that is
being asked (it has received a filter within :data:`ACTIVE_WINDOW_S`): in a leader-elected
pair, the standby replica's extender is never called and stays silent.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from scheduler.core.state import IntArray
from scheduler.kube.podwarning import EVENT_REASON_BYPASSED, PodWarning

# An extender that received no filter for this long is not the one kube-scheduler is using.
ACTIVE_WINDOW_S: Final = 300.0
# Answers remembered (pods filtered and not bound yet); past this the oldest are forgotten, and
# such a pod, if it is bound later, is judged as never answered.
REMEMBERED_ANSWERS: Final = 20_000

Clock = Callable[[], float]


def bypassed(key: str, uid: str, reason: str) -> PodWarning:
    """The Warning Event on a pod placed without the extender, ``reason`` saying how."""
    return PodWarning.on(key, uid, EVENT_REASON_BYPASSED,
                         f"placed by its scheduler without the gpufrag extender: {reason}")


BypassListener = Callable[[PodWarning], None]


@dataclass(frozen=True, slots=True)
class _Answer:
    uid: str
    rows: IntArray  # the state rows the filter passed (its decision: one)


class BypassWatch:
    """What this extender answered for pods not bound yet, and the pods bound without it.

    :meth:`asked` is called when a filter request for a pod arrives, before anything can make
    it wait (the cache lock), :meth:`answered` when its answer is made; the cache calls
    :meth:`bound` (with its lock held) when the watch shows a pod bound."""

    def __init__(self, *, clock: Clock = time.time,
                 remember: int = REMEMBERED_ANSWERS) -> None:
        self.clock = clock
        self.remember = remember
        self.total = 0
        self.on_bypass: BypassListener | None = None
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}   # pod key -> filters being answered now
        self._answers: OrderedDict[str, _Answer] = OrderedDict()
        self._asked_at = -float("inf")

    def asked(self, key: str) -> None:
        with self._lock:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            self._asked_at = self.clock()

    def answered(self, key: str, uid: str, rows: IntArray | None) -> None:
        """The filter for ``key`` is done: ``rows`` are the state rows it passed (None: it
        made no answer, e.g. the request was malformed)."""
        with self._lock:
            left = self._in_flight.get(key, 0) - 1
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)
            if rows is None:
                return
            self._answers.pop(key, None)
            self._answers[key] = _Answer(uid, rows)
            while len(self._answers) > self.remember:
                self._answers.popitem(last=False)

    def bound(self, key: str, uid: str, node: str, row: int | None) -> PodWarning | None:
        """The watch shows the pod ``key`` (a GPU pod of this scheduler) newly bound to
        ``node`` (state row ``row``; None when the state has no such node): the bypass, when
        this extender did not pass that node for it, else None."""
        with self._lock:
            answer = self._answers.pop(key, None)
            filtering = key in self._in_flight
            active = self.clock() - self._asked_at <= ACTIVE_WINDOW_S
        if filtering:
            reason = ("bound while the gpufrag extender was still answering its filter: "
                      "kube-scheduler gave up waiting (httpTimeout) and placed it without the "
                      "extender, since the extender is ignorable")
        elif answer is not None and answer.uid in ("", uid):
            if row is not None and bool(np.any(answer.rows == row)):
                return None
            reason = (f"bound to {node}, a node the gpufrag extender did not pass for it: "
                      "kube-scheduler ignored the extender's answer (it arrived after "
                      "httpTimeout, or the extender is ignorable and failed)")
        elif active:
            reason = ("bound with no filter answer from the gpufrag extender: kube-scheduler "
                      "did not reach it (unreachable or failing, and ignorable), or the pod was "
                      "created with spec.nodeName")
        else:
            return None
        warning = bypassed(key, uid, f"{reason}; no fragmentation scoring and no GPU record for "
                                     "it")
        with self._lock:
            self.total += 1
        if self.on_bypass is not None:
            self.on_bypass(warning)
        return warning


__all__ = ["ACTIVE_WINDOW_S", "REMEMBERED_ANSWERS", "BypassListener", "BypassWatch",
           "bypassed"]
