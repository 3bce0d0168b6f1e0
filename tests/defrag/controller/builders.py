"""Builders for defrag tests: snapshots from core types, and Kubernetes objects as JSON dicts
(the shape the API returns), with keyword overrides."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from defrag.controller.config import DefragConfig, Limits
from defrag.controller.model import PodInfo, Snapshot, snapshot_of_state
from gpufrag import conventions as cv
from scheduler.core import ClusterState, NodeSpec, PodRequest
from tests.builders import node as core_node

T4_MIB = 16_384

Placed = tuple[PodRequest, str, tuple[int, ...]]


def gpu_node(name: str, gpus: int = 2, **overrides: Any) -> NodeSpec:
    fields: dict[str, Any] = {"gpu_count": gpus, "gpu_memory_mib": T4_MIB}
    fields.update(overrides)
    return core_node(name, **fields)


def share(name: str, milli: int, namespace: str = "ns", **overrides: Any) -> PodRequest:
    fields: dict[str, Any] = dict(name=name, namespace=namespace, cpu_milli=1_000,
                                  memory_mib=1_024, num_gpu=1, gpu_milli=milli)
    fields.update(overrides)
    return PodRequest(**fields)


def snapshot(nodes: Sequence[NodeSpec], placed: Sequence[Placed], *, used_fraction: float = 0.5,
             pending: Sequence[PodRequest] = (), infos: Mapping[str, PodInfo] | None = None,
             **kwargs: Any) -> Snapshot:
    """A cluster where every pod uses ``used_fraction`` of what it reserves."""
    state = ClusterState(nodes)
    for pod, where, gpus in placed:
        state.place(pod, where, gpus)
    used = {key: used_fraction * p.pod.gpu_milli / 1000 * float(
        state.gpu_memory_mib[state.index[p.node]]) for key, p in state.pods.items()}
    snap = snapshot_of_state(state, used, pending=list(pending), infos=infos)
    for key, value in kwargs.items():
        setattr(snap, key, value)
    return snap


def config(total: int = 10, per_node: int = 10, per_namespace: int = 10,
           **overrides: Any) -> DefragConfig:
    return DefragConfig(limits=Limits(per_node=per_node, per_namespace=per_namespace,
                                      total=total), **overrides).validate()


def positions(snap: Snapshot) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {k: (p.node, p.gpus) for k, p in snap.state.pods.items()}


# ------------------------------------------------------------------ Kubernetes objects (JSON)
def k8s_node(name: str, *, gpus: int = 2, product: str = "Tesla-T4",
             memory_mib: int | None = T4_MIB, annotations: Mapping[str, str] | None = None,
             unschedulable: bool = False, taints: Sequence[Mapping[str, str]] = ()
             ) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if gpus:
        labels[cv.LABEL_GPU_PRODUCT] = product
        if memory_mib is not None:
            labels[cv.LABEL_GPU_MEMORY_MIB] = str(memory_mib)
    allocatable = {"cpu": "64", "memory": "256Gi", "pods": "110", cv.RESOURCE_GPU: str(gpus),
                   cv.RESOURCE_GPU_MILLI: str(gpus * 1000)}
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = list(taints)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": dict(annotations or {})},
            "spec": spec, "status": {"allocatable": allocatable, "capacity": allocatable}}


def k8s_pod(name: str, *, namespace: str = "ns", node: str = "", milli: int = 0, gpus: int = 0,
            indices: str | None = None, owner: str | None = "ReplicaSet",
            owner_uid: str | None = None, labels: Mapping[str, str] | None = None,
            annotations: Mapping[str, str] | None = None, phase: str | None = None,
            priority: int | None = None, scheduler_name: str = "default-scheduler",
            uid: str | None = None, spec_extra: Mapping[str, Any] | None = None
            ) -> dict[str, Any]:
    requests = {"cpu": "1", "memory": "1Gi"}
    if milli:
        requests[cv.RESOURCE_GPU_MILLI] = str(milli)
    if gpus:
        requests[cv.RESOURCE_GPU] = str(gpus)
    notes = dict(annotations or {})
    if indices is not None:
        notes[cv.ANNOTATION_GPU_INDICES] = indices
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}",
                            "labels": dict(labels or {"app": name}), "annotations": notes}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner,
                                    "name": f"{owner.lower()}-{name}",
                                    "uid": owner_uid or f"owner-{name}", "controller": True}]
    spec: dict[str, Any] = {"schedulerName": scheduler_name,
                            "containers": [{"name": "main", "image": "x",
                                            "resources": {"requests": requests}}]}
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    spec.update(spec_extra or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": phase or ("Running" if node else "Pending")}}


def k8s_pdb(name: str, *, namespace: str = "ns", match: Mapping[str, str] | None = None,
            allowed: int = 1) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": dict(match or {})}},
            "status": {"disruptionsAllowed": allowed}}
