"""Allocate, GetPreferredAllocation and PreStartContainer: the decisions behind the RPCs.

One :class:`Allocator` serves both resources. Calls decide one at a time (a lock), so two
calls can never match the same pod; what a call needs from the network (a relist, the record
keys) is fetched before it takes the lock, never under it, and nothing called under the lock
calls back into it; the match is recorded in memory before the pod is marked
through the API, so the next call skips it even before the watch brings the mark back. Marking
is best effort: when the API server cannot be reached the container still gets its GPUs (its
pod is not failed for an annotation), the failure is logged and counted, and the in-memory
record guards the rest of this process's life.

Which GPUs: those recorded for the pod (:func:`~node.deviceplugin.matching.resolve`), or, for
a whole-GPU pod with no record (another scheduler placed it), the devices the kubelet chose
(:func:`~node.deviceplugin.matching.kubelet_choice`), logged ``kubelet_choice`` once per pod
and counted in ``gpufrag_deviceplugin_allocated_containers_total{source="kubelet"}``.

What a container gets is :func:`node.gpus.container_grant` (the home both delivery paths
share); :func:`container_response` puts it into the kubelet's message.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from node.deviceplugin.api import pb
from node.deviceplugin.config import DevicePluginConfig, Kind
from node.deviceplugin.devices import gpu_of, preferred
from node.deviceplugin.matching import (
    Candidate,
    PodAsk,
    Refusal,
    find,
    holders,
    idle_gpus,
    kubelet_choice,
    resolve,
    takes_kubelet_choice,
)
from node.deviceplugin.metrics import PluginMetrics
from node.deviceplugin.trust import RecordTrust
from node.deviceplugin.writes import PodWriteError, PodWriter
from node.gpus import DeviceNodes, Gpu, container_grant
from node.health import HealthBoard

GRANTS_KEPT = 4096  # device-ID sets -> GPUs remembered for PreStartContainer


class PodSource(Protocol):
    """The pods on this node (:class:`node.deviceplugin.pods.KubeNodePods`)."""

    def asks(self) -> list[PodAsk]: ...

    def relist(self) -> None: ...


class AllocationRefused(RuntimeError):
    """The call gets no GPUs; the message goes to the kubelet and so to the pod's Events."""


def container_response(gpus: Sequence[Gpu], kind: Kind, count: int, *, nodes: DeviceNodes,
                       config: DevicePluginConfig,
                       memory_mib: int = 0) -> pb.ContainerAllocateResponse:
    """What the kubelet puts into the container (:func:`node.gpus.container_grant`);
    ``memory_mib``: the container's GPU-memory ask, which makes it a memory share of its one
    GPU."""
    grant = container_grant(gpus, milli=count if kind is Kind.SHARE else 0,
                            memory_mib=memory_mib, nodes=nodes, config=config)
    return pb.ContainerAllocateResponse(
        envs=grant.envs,
        devices=[pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")
                 for path in grant.device_paths],
        mounts=[pb.Mount(container_path=path, host_path=path, read_only=False)
                for path in grant.mount_paths])


class Allocator:
    """Matches calls to pods, records what each container got, answers the RPCs."""

    def __init__(self, config: DevicePluginConfig, board: HealthBoard, pods: PodSource,
                 writer: PodWriter, metrics: PluginMetrics, *, log: FilteringBoundLogger,
                 nodes: DeviceNodes, records: RecordTrust | None,
                 clock: Callable[[], float] = time.time) -> None:
        self._config = config
        # Which GPU records are honoured (node.deviceplugin.trust); None: every record
        # (--no-verify-records, a cluster whose tenants all trust each other).
        self._records = records
        self._board = board
        self._pods = pods
        self._writer = writer
        self._metrics = metrics
        self._log = log
        self._nodes = nodes
        self._clock = clock
        self._lock = threading.Lock()
        self._given: dict[str, dict[str, tuple[str, ...]]] = {}  # pod UID -> container -> GPUs
        self._grants: OrderedDict[frozenset[str], tuple[str, ...]] = OrderedDict()

    def forget(self, uid: str) -> None:
        """The pod is gone: drop its record (keeps memory bounded by the pods on the node)."""
        with self._lock:
            self._given.pop(uid, None)

    # -- matching --------------------------------------------------------------------------------
    def _find(self, kind: Kind, count: int) -> Candidate | Refusal:
        """The pod this call is for, from the cache (under the lock)."""
        return find(self._pods.asks(), kind, count, node=self._config.node_name,
                    resource=self._config.resource(kind), given=self._given)

    def _prepare(self, kind: Kind, count: int) -> None:
        """What a call may need from the network, fetched before it takes the lock: a relist
        when the cache holds no pod for it (one bound moments ago may not be in it yet), and
        the record keys when its pod's record names a key not read yet. Neither runs under
        the lock: each is network I/O (bounded by the client's deadline), and a relist that
        finds a pod gone calls :meth:`forget`, which takes the lock."""
        with self._lock:
            found = self._find(kind, count)
        if isinstance(found, Refusal):
            try:
                self._pods.relist()
            except Exception as exc:  # the API server is down: answer from the cache
                self._log.warning("relist_failed", error=str(exc))
                return
            with self._lock:
                found = self._find(kind, count)
        if isinstance(found, Candidate) and self._records is not None and \
                found.pod.gpus is not None:
            self._records.refresh(found.pod)

    def preferred(self, kind: Kind, request: pb.ContainerPreferredAllocationRequest) -> list[str]:
        """The devices of the GPUs recorded for the pod this call is for, where the kubelet
        has them free; for a pod that takes the kubelet's choice, those of the lowest-index
        idle GPUs (:func:`idle_gpus`); the lowest free device IDs otherwise (never an error:
        Allocate says)."""
        size = request.allocation_size
        self._prepare(kind, size)
        with self._lock:
            found = self._find(kind, size)
            target: tuple[str, ...] = ()
            if isinstance(found, Candidate) and takes_kubelet_choice(
                    found.pod, kubelet_fallback=self._config.kubelet_fallback):
                target = idle_gpus(self._pods.asks(), self._board, self._given)
            elif isinstance(found, Candidate):
                gpus = resolve(found, self._board, self._config.names)
                if not isinstance(gpus, Refusal):
                    target = tuple(gpu.uuid for gpu in gpus)
        return preferred(request.available_deviceIDs, request.must_include_deviceIDs, size,
                         target)

    def allocate(self, kind: Kind, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        """One container's allocation; raises :class:`AllocationRefused`."""
        count = len(device_ids)
        self._prepare(kind, count)
        with self._lock:
            found = self._find(kind, count)
            if isinstance(found, Refusal):
                raise AllocationRefused(found.message)
            pod, container = found.pod, found.container
            source = "record"
            if takes_kubelet_choice(pod, kubelet_fallback=self._config.kubelet_fallback):
                source = "kubelet"
                gpus = kubelet_choice(pod, self._board, device_ids)
            else:
                gpus = resolve(found, self._board, self._config.names)
                if not isinstance(gpus, Refusal) and self._records is not None:
                    gpus = self._trusted(pod, gpus)
            if not isinstance(gpus, Refusal):
                uuids = tuple(gpu.uuid for gpu in gpus)
                first_of_pod = pod.uid not in self._given and not pod.allocated
                shared = self._held_by_others(pod, uuids) if source == "kubelet" else {}
                record = self._given.setdefault(pod.uid, {})
                record[container.name] = uuids
                given = {**pod.allocated, **record}
                self._grants[frozenset(device_ids)] = uuids
                while len(self._grants) > GRANTS_KEPT:
                    self._grants.popitem(last=False)
        if isinstance(gpus, Refusal):  # the Event is network I/O: written after the lock
            self._refused(pod, gpus.message)
            raise AllocationRefused(gpus.message)
        resource = self._config.resource(kind)
        self._metrics.allocated_containers.labels(resource, source).inc()
        if source == "kubelet" and first_of_pod:
            self._log.info("kubelet_choice", pod=pod.key,
                           reason=f"no {self._config.names.annotation_gpu_indices} annotation: "
                                  f"not placed by {self._config.names.scheduler_name}'s bind",
                           effect="its containers get the GPUs the kubelet chose")
        for uuid, pods in shared.items():
            self._log.warning("kubelet_choice_in_use", pod=pod.key, uuid=uuid, held_by=pods[:5],
                              effect="the container shares this GPU with those pods (the "
                                     "kubelet counts whole GPUs and shares apart): keep other "
                                     "schedulers' GPU pods off the nodes where "
                                     f"{self._config.names.scheduler_name} places shares")
        kubelet_gpus = sorted({gpu_of(d) for d in device_ids})
        self._log.info("allocated", pod=pod.key, container=container.name, resource=resource,
                       count=count, source=source, gpus=[gpu.index for gpu in gpus],
                       uuids=list(uuids))
        if kubelet_gpus != sorted(uuids):
            # The kubelet did not take the preferred devices (NUMA alignment, or its books
            # differ after a swap); its IDs are only counters, the container gets the GPUs.
            self._log.info("kubelet_devices_differ", pod=pod.key, kubelet_gpus=kubelet_gpus)
        try:
            self._writer.mark_allocated(pod, self._config.annotation_allocated, given)
        except PodWriteError as exc:
            self._metrics.mark_errors.inc()
            self._log.error("mark_failed", pod=pod.key, error=str(exc),
                            effect="the container gets its GPUs; the mark is missing until "
                                   "the plugin restarts and the pod is no longer pending")
        return container_response(gpus, kind, count, nodes=self._nodes, config=self._config,
                                  memory_mib=container.memory_mib)

    def _trusted(self, pod: PodAsk, gpus: tuple[Gpu, ...]) -> tuple[Gpu, ...] | Refusal:
        """``gpus`` when the pod's record is one the extender signed (under the lock: no
        network I/O here, the keys were refreshed by :meth:`_prepare`)."""
        assert self._records is not None
        problem = self._records.problem(pod)
        if not problem:
            return gpus
        self._metrics.refused_records.inc()
        names = self._config.names
        return Refusal(f"pod {pod.key}: its {names.annotation_gpu_indices}={pod.gpus_text!r} "
                       f"is not honoured: {problem}. Only {names.scheduler_name}'s extender "
                       f"records GPUs for a pod (signed at bind, for that pod on that node); a "
                       f"record written by anyone else could name another pod's GPU", pod)

    def _held_by_others(self, pod: PodAsk, uuids: Sequence[str]) -> dict[str, list[str]]:
        """Which of ``uuids`` other pods hold or are promised (:func:`holders`); under the
        lock."""
        others = [other for other in self._pods.asks() if other.uid != pod.uid]
        held = holders(others, self._board, self._given)
        return {uuid: held[uuid] for uuid in uuids if uuid in held}

    def _refused(self, pod: PodAsk | None, message: str) -> None:
        self._log.warning("allocation_refused", pod=pod.key if pod else None, reason=message)
        if pod is None:
            return
        try:
            self._writer.warn(pod, message, now=self._clock())
        except PodWriteError as exc:
            self._log.warning("event_failed", pod=pod.key, error=str(exc))

    def prestart(self, device_ids: Sequence[str]) -> None:
        """Refuse to start a container whose GPUs went unhealthy since Allocate."""
        with self._lock:
            uuids = self._grants.get(frozenset(device_ids))
        if uuids is None:  # granted before a restart of this plugin: the kubelet's IDs
            uuids = tuple(sorted({gpu_of(d) for d in device_ids}))
        for uuid in uuids:
            gpu = self._board.by_uuid.get(uuid)
            if gpu is not None and not self._board.is_healthy(uuid):
                raise AllocationRefused(f"GPU {gpu.index} ({uuid}) became unhealthy after it was "
                                        f"allocated ({self._board.reason(uuid)}); the container "
                                        f"is not started on it")
