"""Which GPU records the device plugin honours: those the extender signed (:mod:`gpufrag.records`).

A pod's ``gpu-indices`` annotation names GPUs; anyone who can write the pod can write it. The
plugin hands a container the GPUs a record names only when the pod also carries the extender's
``gpu-record`` signature over its UID, its node and those indices, checked against the public
keys the extender publishes (the ConfigMap ``names.record_keys_configmap`` in
``names.hints_namespace``; docs/security.md). A pod with no ``gpu-indices`` at all is not judged
here: a whole-GPU pod of another scheduler takes the kubelet's choice, as before.

:class:`KubeRecordKeys` reads the ConfigMap at the first record and again whenever a record
names a key it does not hold (at most every :data:`REFRESH_MIN_S`) or its copy is older than
:data:`REFRESH_MAX_S`, so a key published after the plugin started (rotation, or the
extender's first start) is picked up without a restart; a read that fails keeps the last keys.
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

REFRESH_MIN_S: Final = 5.0
REFRESH_MAX_S: Final = 60.0

log = structlog.get_logger("gpufrag.deviceplugin")


class RecordTrust(Protocol):
    """Says why a pod's GPU record is not honoured ('' when it is)."""

    def problem(self, pod: PodAsk) -> str: ...


def record_problem(verifier: RecordVerifier, pod: PodAsk) -> str:
    """Why ``verifier`` does not accept ``pod``'s record ('' when it does)."""
    return verifier.problem(pod.record, uid=pod.uid, node=pod.node,
                            gpus_text=gpu_indices_text(pod.gpus or ()))


class FixedRecordKeys:
    """:class:`RecordTrust` with keys given once (tests, benchmarks)."""

    def __init__(self, verifier: RecordVerifier) -> None:
        self.verifier = verifier

    def problem(self, pod: PodAsk) -> str:
        return record_problem(self.verifier, pod)


class KubeRecordKeys:
    """:class:`RecordTrust` with the public keys read from the API (module docstring)."""

    def __init__(self, read: Callable[[], dict[str, str] | None], *, where: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self.where = where
        self._clock = clock
        self._lock = threading.Lock()
        self._verifier = RecordVerifier({})
        self._read_at = -float("inf")
        self.last_error = ""

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

    def _refresh(self, *, unknown_key: bool) -> None:
        now = self._clock()
        age = now - self._read_at
        if not (age >= REFRESH_MAX_S or (unknown_key and age >= REFRESH_MIN_S)):
            return
        self._read_at = now
        try:
            data = self._read()
            self._verifier = RecordVerifier.from_pems(data or {}, source=self.where)
            self.last_error = "" if data is not None else f"{self.where} does not exist"
        except (ApiError, BadInput) as e:
            self.last_error = str(e)
            log.warning("record_keys_unreadable", source=self.where, error=str(e),
                        effect="the keys read before stay in use")

    def problem(self, pod: PodAsk) -> str:
        with self._lock:
            self._refresh(unknown_key=False)
            if self._verifier.unknown_key(pod.record):
                self._refresh(unknown_key=True)
            found = record_problem(self._verifier, pod)
            if found and self.last_error:
                found = f"{found} ({self.last_error})"
            return found


__all__ = ["REFRESH_MAX_S", "REFRESH_MIN_S", "FixedRecordKeys", "KubeRecordKeys", "RecordTrust",
           "record_problem"]
