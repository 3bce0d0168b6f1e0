"""From a GPU process's pid to the pod it belongs to.

Two steps, kept apart so the first is pure:

1. ``/proc/<pid>/cgroup`` names the pod's cgroup, and the kubelet puts the pod UID in that
   name. :func:`pod_uid_from_cgroup` parses the file's text for every layout the kubelet
   writes: cgroup v1 and v2, the ``systemd`` driver
   (``kubepods-burstable-pod<uid with _ for ->.slice``) and the ``cgroupfs`` driver
   (``/kubepods/besteffort/pod<uid>/<container>``), Guaranteed pods (no QoS level), kind's
   ``kubelet-kubepods`` prefix, and paths made relative by a cgroup namespace (``/../..``).
2. The UID becomes namespace/name through the Kubernetes API: :class:`PodDirectory` caches the
   pods on this node (one list call, ``fieldSelector=spec.nodeName``) and refreshes on a miss,
   at most every ``min_refresh_s``, so a newly started pod resolves within one interval.

Static pods are the one wrinkle: their cgroup carries the config hash, not the mirror pod's UID;
the directory also indexes pods by their ``kubernetes.io/config.hash`` annotation.

The same list also reads each pod's GPU share (:class:`PodShare`: what it asks, converted by the
extender's own :func:`scheduler.kube.convert.pod_from_k8s` with the shared names, and the GPU
indices recorded at bind), so the isolation check (:mod:`node.agent.isolation`) holds measured
memory against the share the pod was placed with, at no extra API call. A pod that gets its
GPUs through DRA claims has no recorded indices: its share and GPUs are its claims'
allocation, read (one ``get`` per claim of such a pod) through the one reader of claims,
:mod:`scheduler.kube.claims`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from structlog.typing import FilteringBoundLogger

from gpufrag.conventions import ANNOTATION_GPU_ALLOCATED, DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from gpufrag.records import Given, gpu_indices_text, parse_allocated
from scheduler.core.types import PodRequest
from scheduler.kube.claims import (
    MigPartition,
    listed_pod_gpus,
    listed_pod_partitions,
    pod_claim_keys,
)
from scheduler.kube.convert import bound_gpus, pod_from_k8s
from scheduler.kube.errors import ApiError, api_errors

ANNOTATION_CONFIG_HASH = "kubernetes.io/config.hash"

# One path segment naming a pod: "pod<uid>" (cgroupfs) or "<prefix>-pod<uid>.slice" (systemd,
# where the UID's dashes become underscores). Static pods use a 32-hex config hash instead.
_POD_SEGMENT = re.compile(
    r"^(?:[a-z0-9_.-]*-)?pod"
    r"(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})"
    r"(?:\.slice)?$",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class PodRef:
    """Who a pod is: enough to label a metric, patch an event onto it, or match it by UID."""

    namespace: str
    name: str
    uid: str


def pod_uid_from_cgroup_path(path: str) -> str | None:
    """The pod UID in one cgroup path, or None when the path is not inside a pod."""
    for segment in reversed(path.split("/")):
        match = _POD_SEGMENT.match(segment)
        if match:
            return match.group("uid").replace("_", "-").lower()
    return None


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID named by the contents of a ``/proc/<pid>/cgroup`` file.

    Each line is ``hierarchy-id:controllers:path`` (v2 has the single line ``0::path``; v1 one
    line per hierarchy, all naming the same pod). Malformed lines are skipped.
    """
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        uid = pod_uid_from_cgroup_path(parts[2])
        if uid is not None:
            return uid
    return None


def pod_uid_for_pid(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """Read ``<proc_root>/<pid>/cgroup``; None when the process is gone or not in a pod.

    The pid is in the host's PID namespace (NVML reports host pids), so the agent needs
    ``hostPID: true`` for this lookup to see the GPU processes.
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:  # exited since NVML listed it, or not visible from here
        return None
    return pod_uid_from_cgroup(text)


# --- UID -> namespace/name ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodShare:
    """What a GPU pod was placed with: its request (as the extender reads it) and the GPU
    indices recorded at bind (None when absent or malformed: a pod placed by someone else)."""

    request: PodRequest
    gpus: tuple[int, ...] | None = None
    gpus_text: str = ""  # the annotation as written, for messages
    # What the device plugin says it gave each container (gpu-allocated; gpufrag.records);
    # None when it has not marked the pod, or the mark cannot be read (the plugin says so).
    given: Given | None = None
    # The MIG partitions its DRA claims were allocated on this node (their GPUs are in
    # ``gpus``): the instance, profile and start it runs in. Empty for any other pod.
    partitions: tuple[MigPartition, ...] = ()


def share_from_pod(obj: Mapping[str, Any], names: KubeNames = DEFAULT_NAMES,
                   claims: Mapping[str, Mapping[str, Any]] | None = None) -> PodShare | None:
    """The share of a pod (API JSON shape); None when it asks no GPU or its request cannot be
    read (the extender would not have placed it either). A pod that gets its GPUs through
    DRA claims (``claims``: its ResourceClaims by ``namespace/name``) holds what their
    allocations name on its node, read as the extender reads them
    (:func:`scheduler.kube.claims.listed_pod_gpus`); its GPU indices are those. A DRA MIG
    pod asks no GPU of the placement state: it holds the GPUs of the MIG partitions its
    claims were allocated there, each with its profile and start
    (:func:`scheduler.kube.claims.listed_pod_partitions`)."""
    try:
        request = pod_from_k8s(obj, names)
        through_claims = listed_pod_gpus(obj, request, claims) if claims is not None else None
        partitions = (listed_pod_partitions(obj, claims)
                      if claims is not None and through_claims is not None else ())
    except (BadInput, ValueError):
        return None
    if through_claims is not None:
        request, gpus = through_claims
        if not request.wants_gpu and not partitions:
            return None
        indices = tuple(sorted({*(gpus or ()), *(p.index for p in partitions)}))
        return PodShare(request, indices, gpu_indices_text(indices), partitions=partitions)
    if not request.wants_gpu:
        return None
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    mark = annotations.get(ANNOTATION_GPU_ALLOCATED)
    try:
        given = parse_allocated(mark) if isinstance(mark, str) else None
    except BadInput:
        given = None
    return PodShare(request, bound_gpus(obj, names),
                    str(annotations.get(names.annotation_gpu_indices, "")), given)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """A pod on this node as the directory indexes it."""

    ref: PodRef
    config_hash: str | None = None
    share: PodShare | None = None


class PodListError(RuntimeError):
    """Listing the node's pods failed; the directory keeps serving its last list."""


class PodLister(Protocol):
    def list_pods(self) -> Iterable[PodRecord]: ...


class PodDirectory:
    """Pod UID -> :class:`PodRef` for the pods on this node, cached.

    The cache is rebuilt when it is older than ``max_age_s`` (pods that left are dropped) or
    when a lookup misses and the last rebuild is older than ``min_refresh_s`` (a pod that just
    started). A failed list keeps the previous cache and is logged once per failure streak.
    """

    def __init__(self, lister: PodLister, *, clock: Callable[[], float] = time.monotonic,
                 min_refresh_s: float = 10.0, max_age_s: float = 300.0,
                 log: FilteringBoundLogger | None = None) -> None:
        self._lister = lister
        self._clock = clock
        self._min_refresh_s = min_refresh_s
        self._max_age_s = max_age_s
        self._log = log if log is not None else structlog.get_logger("gpufrag.agent.pods")
        self._by_uid: dict[str, PodRef] = {}
        self._shares: dict[str, PodShare] = {}
        self._refreshed_at: float | None = None
        self._failing = False

    def lookup(self, uid: str) -> PodRef | None:
        now = self._clock()
        if self._refreshed_at is None or now - self._refreshed_at > self._max_age_s:
            self._refresh(now)
        ref = self._by_uid.get(uid)
        if ref is None and self._refreshed_at is not None and (
            now - self._refreshed_at >= self._min_refresh_s
        ):
            self._refresh(now)
            ref = self._by_uid.get(uid)
        return ref

    def share_of(self, uid: str) -> PodShare | None:
        """The GPU share of a pod :meth:`lookup` has found (from the same list; no API call)."""
        return self._shares.get(uid)

    def shares(self) -> list[tuple[PodRef, PodShare]]:
        """Every GPU pod on this node with its share, from a list no older than ``max_age_s``
        (what the allocation check reads, GPU processes or not)."""
        now = self._clock()
        if self._refreshed_at is None or now - self._refreshed_at > self._max_age_s:
            self._refresh(now)
        return [(self._by_uid[uid], share) for uid, share in self._shares.items()
                if uid in self._by_uid]

    def _refresh(self, now: float) -> None:
        # Stamp first: a failing API server is asked again after min_refresh_s, not per lookup.
        self._refreshed_at = now
        try:
            records = list(self._lister.list_pods())
        except PodListError as exc:
            if not self._failing:
                self._log.warning("pod_list_failed", error=str(exc), cached_pods=len(self._by_uid))
            self._failing = True
            return
        if self._failing:
            self._log.info("pod_list_recovered", pods=len(records))
        self._failing = False
        by_uid: dict[str, PodRef] = {}
        shares: dict[str, PodShare] = {}
        for record in records:
            by_uid[record.ref.uid] = record.ref
            if record.config_hash:
                by_uid.setdefault(record.config_hash, record.ref)
            if record.share is not None:
                shares[record.ref.uid] = record.share
        self._by_uid = by_uid
        self._shares = shares


# GPU processes that belong to no pod by design: the MPS control daemon's server
# (``nvidia-cuda-mps-server``, started by ``nvidia-cuda-mps-control`` for the device plugin's
# ``--mps`` shares) holds a context on each GPU it serves.
NOT_STRAYS = frozenset({"nvidia-cuda-mps-server", "nvidia-cuda-mps-control"})


class PodResolver:
    """pid -> :class:`PodRef`: the cgroup file, then the directory."""

    def __init__(self, directory: PodDirectory, proc_root: Path = Path("/proc")) -> None:
        self._directory = directory
        self._proc_root = proc_root

    def pod_for_pid(self, pid: int) -> PodRef | None:
        uid = pod_uid_for_pid(pid, self._proc_root)
        return None if uid is None else self._directory.lookup(uid)

    def stray_reason(self, pid: int) -> str:
        """Why :meth:`pod_for_pid` found no pod: ``pod_gone`` when the process's cgroup names a
        pod this node's list does not hold (deleted, its process left behind), ``no_pod`` when
        it runs in no pod's cgroup at all (a host process, another runtime, or gone already);
        '' when it is no stray at all: CUDA's MPS server (:data:`NOT_STRAYS`), which holds GPU
        memory for the share pods it serves wherever it runs (host or a daemon's pod)."""
        if pod_uid_for_pid(pid, self._proc_root) is not None:
            return "pod_gone"
        try:
            name = (self._proc_root / str(pid) / "comm").read_text().strip()
        except OSError:  # gone already
            name = ""
        return "" if name in NOT_STRAYS else "no_pod"


class KubePodLister:
    """Lists this node's pods through the API (RBAC: ``list pods``, cluster-wide)."""

    def __init__(self, api_client: ApiClient, node_name: str, *,
                 request_timeout_s: float = 10.0, names: KubeNames = DEFAULT_NAMES) -> None:
        self._api_client = api_client
        self._core = CoreV1Api(api_client)
        self._resource = ResourceV1Api(api_client)
        self._log = structlog.get_logger("gpufrag.agent.pods")
        self._node_name = node_name
        self._request_timeout_s = request_timeout_s
        self._names = names

    def list_pods(self) -> list[PodRecord]:
        try:
            with api_errors(f"listing pods on node {self._node_name!r}"):
                pods = self._core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={self._node_name}",
                    # "0": served from the API server's watch cache, as the kubelet does.
                    resource_version="0",
                    _request_timeout=self._request_timeout_s,
                )
        except ApiError as exc:
            raise PodListError(str(exc)) from None
        records = []
        to_json: Callable[[object], Any] = self._api_client.sanitize_for_serialization  # untyped
        for pod in pods.items or ():
            meta = pod.metadata
            if meta is None or not meta.uid or not meta.name or not meta.namespace:
                continue
            annotations = meta.annotations or {}
            # The API's JSON shape (camelCase), which the extender's converter reads.
            obj = to_json(pod)
            share = share_from_pod(obj, self._names, self._claims_of(obj))
            records.append(PodRecord(PodRef(meta.namespace, meta.name, meta.uid),
                                     annotations.get(ANNOTATION_CONFIG_HASH), share))
        return records

    def _claims_of(self, obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]] | None:
        """The ResourceClaims a pod uses (DRA), each read by name (``get resourceclaims``:
        claims have no field for their node, and a node's few DRA pods cost fewer calls than
        the cluster's claims); None for a pod that uses none. A claim that cannot be read is
        left out (the pod then holds no GPU through it) and logged."""
        try:
            keys = pod_claim_keys(obj)
        except BadInput:
            return None
        if not keys:
            return None
        found: dict[str, Mapping[str, Any]] = {}
        to_json: Callable[[object], Any] = self._api_client.sanitize_for_serialization  # untyped
        for key in keys:
            namespace, _, name = key.partition("/")
            try:
                with api_errors(f"reading ResourceClaim {key}"):
                    claim = self._resource.read_namespaced_resource_claim(
                        name, namespace, _request_timeout=self._request_timeout_s)
            except ApiError as exc:
                self._log.warning("claim_read_failed", claim=key, error=str(exc))
                continue
            found[key] = to_json(claim)
        return found
