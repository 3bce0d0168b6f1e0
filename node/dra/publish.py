"""Keep this node's ResourceSlices in the API what :func:`node.dra.slices.build_slices` says.

One :meth:`SlicePublisher.sync` lists the slices of this driver on this node (field selectors
``spec.driver`` and ``spec.nodeName``), deletes every one that is not a slice this driver
publishes (a renamed driver's leftovers, a slice from an older layout), and creates or
replaces its own. A pool whose slices are unchanged is left alone: the digest of the whole
pool as it was built (every slice's devices and counter sets) is kept in an annotation of
each slice, because the API server rewrites quantities in canonical form ("81920Mi" comes back
"80Gi") and a field-by-field comparison would replace the slices on every sync. Each change
moves the pool's ``generation`` up in every slice, which tells the scheduler the older
slices of the pool are outdated (a pool of several slices, as a node with GPUs in MIG mode
has, is only used once all its slices show one generation).

It runs at start and every ``publish_interval_s`` after, so a slice someone deleted or edited
comes back within one interval, and at once when a GPU's health changes (:meth:`mark`: an
unhealthy GPU's devices carry a ``NoSchedule`` taint, :mod:`node.dra.slices`). A lock keeps
the health thread's pass and the loop's apart.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from node.dra.slices import Obj, build_slices, slice_name
from node.gpus import Gpu

ANNOTATION_DIGEST = "gpu.gpufrag.io/devices-digest"


class SliceApi(Protocol):
    """ResourceSlices as plain dicts (:class:`node.dra.kube.KubeSlices`); each call raises
    :class:`scheduler.kube.errors.ApiError` on failure."""

    def list(self, *, driver: str, node_name: str) -> list[Obj]: ...

    def create(self, body: Obj) -> None: ...

    def replace(self, name: str, body: Obj) -> None: ...

    def delete(self, name: str) -> None: ...


def pool_digest(slices: Sequence[Obj]) -> str:
    """A digest of a pool's slices (names, pool name, devices, counter sets), as this driver
    built them."""
    text = json.dumps([[obj["metadata"]["name"], obj["spec"]["pool"]["name"],
                        obj["spec"].get("devices"), obj["spec"].get("sharedCounters")]
                       for obj in slices], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _generation(obj: Obj) -> int:
    value = ((obj.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return value if isinstance(value, int) else 0


class SlicePublisher:
    """Publishes one node's slice (module docstring)."""

    def __init__(self, api: SliceApi, *, driver: str, node_name: str, gpus: Sequence[Gpu],
                 mig_enabled: Mapping[int, bool], log: FilteringBoundLogger,
                 node_uid: str = "") -> None:
        self._api = api
        self._driver = driver
        self._node_name = node_name
        self._gpus = tuple(gpus)
        self._mig_enabled = dict(mig_enabled)
        self._node_uid = node_uid
        self._log = log
        self.name = slice_name(node_name, driver)
        self._unhealthy: set[int] = set()
        self._lock = threading.Lock()

    def mark(self, index: int, healthy: bool) -> None:
        """Record GPU ``index``'s health for the next :meth:`sync`."""
        with self._lock:
            if healthy:
                self._unhealthy.discard(index)
            else:
                self._unhealthy.add(index)

    def sync(self) -> str:
        """One pass; returns what it did to this driver's slices: created (none was there),
        replaced or unchanged."""
        with self._lock:
            return self._sync()

    def _sync(self) -> str:
        found = self._api.list(driver=self._driver, node_name=self._node_name)
        newest = max((_generation(obj) for obj in found), default=0)
        desired = build_slices(self._node_name, self._driver, self._gpus, self._mig_enabled,
                               generation=newest + 1, node_uid=self._node_uid,
                               unhealthy=frozenset(self._unhealthy))
        digest = pool_digest(desired)
        names = {obj["metadata"]["name"] for obj in desired}
        current = {(obj.get("metadata") or {}).get("name"): obj for obj in found}
        stale = [name for name in current if name not in names]
        if set(current) == names and all(
                ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_DIGEST)
                == digest for obj in current.values()):
            return "unchanged"
        for name in stale:
            self._api.delete(str(name))
            self._log.info("slice_deleted", slice=name, why="not this driver's slice for "
                           "this node (stale)")
        for obj in desired:
            name = obj["metadata"]["name"]
            obj["metadata"]["annotations"] = {ANNOTATION_DIGEST: digest}
            devices = len(obj["spec"].get("devices") or ())
            old = current.get(name)
            if old is None:
                self._api.create(obj)
                self._log.info("slice_created", slice=name, devices=devices,
                               generation=newest + 1)
            else:
                obj["metadata"]["resourceVersion"] = old["metadata"].get("resourceVersion")
                self._api.replace(name, obj)
                self._log.info("slice_replaced", slice=name, devices=devices,
                               generation=newest + 1)
        return "created" if not current else "replaced"
