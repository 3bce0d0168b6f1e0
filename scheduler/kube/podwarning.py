"""A Warning Event the extender puts on a pod for a cause of its own, as data.

The causes are found in different places (a pod placed without the extender:
:mod:`scheduler.kube.bypass`; a pod that named another namespace's reservation owner:
:mod:`scheduler.kube.reservations`), and one writer puts them all on their pods
(:mod:`scheduler.kube.skipreport`): each cause builds a :class:`PodWarning` with its Event
reason and its message, so the writer needs to know none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

# The Warning Event put on a GPU pod of this scheduler bound without the extender's say.
EVENT_REASON_BYPASSED: Final = "GpufragBypassed"
# ... and on a pod that named another namespace's reservation owner.
EVENT_REASON_RESERVATION_REFUSED: Final = "GpufragReservationRefused"
# ... and on a bound pod whose GPU record changed after its bind (only the bind writes it).
EVENT_REASON_RECORD_CHANGED: Final = "GpufragRecordChanged"


@dataclass(frozen=True, slots=True)
class PodWarning:
    """One Warning Event for pod ``key`` (``namespace/name``): its reason and message."""

    key: str
    namespace: str
    name: str
    uid: str
    event_reason: str
    message: str

    kind: ClassVar[str] = "Pod"

    @classmethod
    def on(cls, key: str, uid: str, event_reason: str, message: str) -> PodWarning:
        namespace, _, name = key.rpartition("/")
        return cls(key, namespace, name, uid, event_reason, message)

    @property
    def label(self) -> str:
        return "pod"


__all__ = ["EVENT_REASON_BYPASSED", "EVENT_REASON_RECORD_CHANGED",
           "EVENT_REASON_RESERVATION_REFUSED", "PodWarning"]
