"""Which GPU records the device plugin honours: those the extender signed (:mod:`gpufrag.records`).

A pod's ``gpu-indices`` annotation names GPUs; anyone who can write the pod can write it. The
plugin hands a container the GPUs a record names only when the pod also carries the extender's
``gpu-record`` signature over its UID, its node and those indices, checked against the public
keys the extender publishes (the ConfigMap ``names.record_keys_configmap`` in
``names.hints_namespace``; docs/security.md). A pod with no ``gpu-indices`` at all is not judged
here: a whole-GPU pod of another scheduler takes the kubelet's choice, as before.

:class:`KubeRecordKeys` reads the ConfigMap at the first record, again whenever a record names a
key it does not hold, and when its copy is older than :data:`REFRESH_MAX_S`, so a key published
after the plugin started (rotation, or the extender's first start) is picked up without a
restart: a record of an unknown key is judged only after a read that began after the call did,
so a key published a moment before is never refused. Reads are one at a time (a caller that
finds one in flight that began after its own call uses that read's keys), each bounded by the
API client's deadline; a read that fails keeps the last keys. :meth:`RecordTrust.refresh` does
the reading, outside the allocator's lock; :meth:`RecordTrust.problem` only reads memory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import kubernetes
import structlog

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from gpufrag.records import RecordVerifier, gpu_indices_text
from node.deviceplugin.matching import PodAsk
from scheduler.kube.errors import ApiError, api_errors

REFRESH_MAX_S: Final = 60.0

log = structlog.get_logger("gpufrag.deviceplugin")


class RecordTrust(Protocol):
    """Says why a pod's GPU record is not honoured ('' when it is)."""

    def refresh(self, pod: PodAsk) -> None:
        """Read what judging ``pod`` needs (network I/O; never called under a lock)."""

    def problem(self, pod: PodAsk) -> str:
        """Why ``pod``'s record is not honoured, from memory only ('' when it is)."""


def record_problem(verifier: RecordVerifier, pod: PodAsk) -> str:
    """Why ``verifier`` does not accept ``pod``'s record ('' when it does)."""
    return verifier.problem(pod.record, uid=pod.uid, node=pod.node,
                            gpus_text=gpu_indices_text(pod.gpus or ()))


class FixedRecordKeys:
    """:class:`RecordTrust` with keys given once (tests, benchmarks)."""

    def __init__(self, verifier: RecordVerifier) -> None:
        self.verifier = verifier

    def refresh(self, pod: PodAsk) -> None:
        pass

    def problem(self, pod: PodAsk) -> str:
        return record_problem(self.verifier, pod)


class KubeRecordKeys:
    """:class:`RecordTrust` with the public keys read from the API (module docstring)."""

    def __init__(self, read: Callable[[], dict[str, str] | None], *, where: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self.where = where
        self._clock = clock
        self._lock = threading.Lock()  # guards the state below; never held over a read
        self._reading = threading.Lock()  # one read at a time
        self._verifier = RecordVerifier({})
        self._read_started = -float("inf")  # when the last completed read began
        self.last_error = ""
        self.reads = 0

    @classmethod
    def from_api(cls, api_client: Any, names: KubeNames) -> KubeRecordKeys:
        core = kubernetes.client.CoreV1Api(api_client)
        name, namespace = names.record_keys_configmap, names.hints_namespace

        def read() -> dict[str, str] | None:
            try:
                with api_errors(f"reading ConfigMap {namespace}/{name}"):
                    found = core.read_namespaced_config_map(name, namespace)
            except ApiError as e:
                if e.status == 404:
                    return None
                raise
            return dict(found.data or {})

        return cls(read, where=f"ConfigMap {namespace}/{name}")

    def refresh(self, pod: PodAsk) -> None:
        asked = self._clock()
        with self._lock:
            stale = asked - self._read_started >= REFRESH_MAX_S
            unknown = self._verifier.unknown_key(pod.record)
        if stale or unknown:
            self._read_since(asked)

    def _read_since(self, asked: float) -> None:
        """A read that began at or after ``asked``: this one, or one that ran meanwhile."""
        with self._reading:
            with self._lock:
                if self._read_started >= asked:
                    return
            started = self._clock()
            self.reads += 1
            try:
                data = self._read()
                verifier = RecordVerifier.from_pems(data or {}, source=self.where)
                error = "" if data is not None else f"{self.where} does not exist"
            except (ApiError, BadInput) as e:
                log.warning("record_keys_unreadable", source=self.where, error=str(e),
                            effect="the keys read before stay in use")
                with self._lock:
                    self._read_started = started
                    self.last_error = str(e)
                return
            with self._lock:
                self._verifier, self._read_started, self.last_error = verifier, started, error

    def problem(self, pod: PodAsk) -> str:
        with self._lock:
            found = record_problem(self._verifier, pod)
            if found and self.last_error:
                found = f"{found} ({self.last_error})"
            return found


__all__ = ["REFRESH_MAX_S", "FixedRecordKeys", "KubeRecordKeys", "RecordTrust",
           "record_problem"]
