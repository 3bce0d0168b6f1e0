"""Keep this node's ResourceSlice in the API what :func:`node.dra.slices.build_slice` says.

One :meth:`SlicePublisher.sync` lists the slices of this driver on this node (field selectors
``spec.driver`` and ``spec.nodeName``), deletes every one that is not the slice this driver
publishes (a renamed driver's leftovers, a slice from an older layout), and creates or
replaces its own. A slice whose devices are unchanged is left alone: the digest of the
devices it was built from is kept in an annotation, because the API server rewrites
quantities in canonical form ("81920Mi" comes back "80Gi") and a field-by-field comparison
would replace the slice on every sync. Each change moves the pool's ``generation`` up, which
tells the scheduler the older slices of the pool are outdated.

It runs at start and every ``publish_interval_s`` after, so a slice someone deleted or edited
comes back within one interval.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from structlog.typing import FilteringBoundLogger

from node.dra.slices import Obj, build_slice, slice_name
from node.gpus import Gpu

ANNOTATION_DIGEST = "gpu.gpufrag.io/devices-digest"


class SliceApi(Protocol):
    """ResourceSlices as plain dicts (:class:`node.dra.kube.KubeSlices`); each call raises
    :class:`scheduler.kube.errors.ApiError` on failure."""

    def list(self, *, driver: str, node_name: str) -> list[Obj]: ...

    def create(self, body: Obj) -> None: ...

    def replace(self, name: str, body: Obj) -> None: ...

    def delete(self, name: str) -> None: ...


def devices_digest(spec: Mapping[str, Any]) -> str:
    """A digest of a slice's devices and pool name, as this driver built them."""
    text = json.dumps([spec["pool"]["name"], spec["devices"]], sort_keys=True)
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

    def sync(self) -> str:
        """One pass; returns what it did to this driver's slice: created, replaced or
        unchanged."""
        found = self._api.list(driver=self._driver, node_name=self._node_name)
        mine = [obj for obj in found if (obj.get("metadata") or {}).get("name") == self.name]
        stale = [obj for obj in found if obj not in mine]
        newest = max((_generation(obj) for obj in found), default=0)
        desired = build_slice(self._node_name, self._driver, self._gpus, self._mig_enabled,
                              generation=newest + 1, node_uid=self._node_uid)
        digest = devices_digest(desired["spec"])
        desired["metadata"]["annotations"] = {ANNOTATION_DIGEST: digest}
        for obj in stale:
            name = obj["metadata"]["name"]
            self._api.delete(name)
            self._log.info("slice_deleted", slice=name, why="not this driver's slice for "
                           "this node (stale)")
        if not mine:
            self._api.create(desired)
            self._log.info("slice_created", slice=self.name, devices=len(self._gpus),
                           generation=newest + 1)
            return "created"
        current = mine[0]
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        if annotations.get(ANNOTATION_DIGEST) == digest and not stale:
            return "unchanged"
        desired["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion")
        self._api.replace(self.name, desired)
        self._log.info("slice_replaced", slice=self.name, devices=len(self._gpus),
                       generation=newest + 1)
        return "replaced"
