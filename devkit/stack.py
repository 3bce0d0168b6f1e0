"""Pieces of the gpufrag stack for end-to-end tests: GPU pods, fake GPU nodes and waits on the
real API server.

The extender subprocess and the gpufrag-scheduler configuration live beside this module
(:class:`devkit.extender.ExtenderProcess`, :func:`devkit.extender.gpufrag_scheduler_config`),
shared with ``gpufrag demo`` and the benchmarks.

Shared by the e2e modules so each test states only its scenario.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import kubernetes

from devkit.build import REPO_ROOT
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag import conventions as cv
from scheduler.core import ClusterState
from scheduler.kube import reservations as rsv
from scheduler.kube.cache import ClusterCache

SCHEDULER = cv.SCHEDULER_NAME
GROUP_LABEL = "e2e.gpufrag.io/group"


def gpu_pod(name: str, *, gpus: int = 0, milli: int = 0, cpu: str = "1", memory: str = "1Gi",
            products: Iterable[str] = (), model: str = "", version: str = "",
            scheduler: str = SCHEDULER, group: str = "", gpu_memory_mib: int = 0
            ) -> dict[str, Any]:
    """A bare pod asking for whole GPUs (``gpus``) or a GPU share (``milli``, and/or
    ``gpu_memory_mib`` of one GPU's memory)."""
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests[cv.RESOURCE_GPU] = str(gpus)
    if milli:
        requests[cv.RESOURCE_GPU_MILLI] = str(milli)
    if gpu_memory_mib:
        requests[cv.RESOURCE_GPU_MEMORY_MIB] = str(gpu_memory_mib)
    labels = {k: v for k, v in ((cv.LABEL_MODEL, model), (cv.LABEL_MODEL_VERSION, version)) if v}
    annotations = {cv.ANNOTATION_GPU_SPEC: "|".join(products)} if products else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                        "resources": {"requests": requests, "limits": {
                            k: v for k, v in requests.items() if k not in ("cpu", "memory")}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if group:
        spec["nodeSelector"] = {GROUP_LABEL: group}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec}


def bound_node(core: kubernetes.client.CoreV1Api, namespace: str, name: str,
               timeout_s: float = 60.0) -> str:
    def check() -> str | None:
        pod = core.read_namespaced_pod(name, namespace)
        return (pod.spec.node_name if pod.spec else None) or None

    return wait_until(check, timeout_s=timeout_s, what=f"pod {namespace}/{name} bound")


def make_nodes(plane: ControlPlane, group: str, layout: Mapping[str, int], *, per_product: int,
               gpus: int = 8) -> list[str]:
    """``per_product`` nodes of each product (``layout`` maps product -> GPU memory MiB)."""
    names = []
    for product, memory in layout.items():
        for i in range(per_product):
            name = f"{group}-{product.lower()}-{i}"
            plane.create_gpu_node(name, gpus, product, memory, cpu_milli=128_000,
                                  memory_mib=1024 * 1024, labels={GROUP_LABEL: group})
            names.append(name)
    return names


def delete_nodes(plane: ControlPlane, names: Iterable[str]) -> None:
    core = kubernetes.client.CoreV1Api(plane.api_client())
    for name in names:
        try:
            core.delete_node(name)
        except kubernetes.client.ApiException as e:
            if e.status != 404:
                raise


def cluster_state(plane: ControlPlane, group: str) -> ClusterState:
    """The group's nodes and their pods as the extender's cache reads them (same converters)."""
    api = plane.api_client()
    core = kubernetes.client.CoreV1Api(api)
    # sanitize_for_serialization carries no type hints.
    to_json: Any = api.sanitize_for_serialization
    nodes = [to_json(n) for n in core.list_node(label_selector=f"{GROUP_LABEL}={group}").items]
    names = {n["metadata"]["name"] for n in nodes}
    pods = [to_json(p) for p in core.list_pod_for_all_namespaces().items
            if p.spec is not None and p.spec.node_name in names]
    cache = ClusterCache()
    cache.load(nodes, pods)
    return cache.state


RESERVATIONS_CRD = REPO_ROOT / "manifests" / "base" / "crd-gpureservation.yaml"
PLACEMENT_HINTS = REPO_ROOT / "manifests" / "base" / "placement-hints.yaml"


def install_reservations_crd(plane: ControlPlane) -> None:
    """The GPUReservation CRD as manifests/base ships it, established before any extender or
    defrag cycle lists reservations (a cluster without it stops defrag before any eviction)."""
    plane.kubectl("apply", "-f", str(RESERVATIONS_CRD))
    plane.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                  f"crd/{rsv.PLURAL}.{rsv.GROUP}")


def install_defrag_namespace(plane: ControlPlane) -> None:
    """The hints namespace with the placement-hints ConfigMap, as manifests/base ships them:
    where a defrag cycle keeps its hints, reservations and state."""
    plane.ensure_namespace(cv.HINTS_NAMESPACE)
    plane.kubectl("apply", "-n", cv.HINTS_NAMESPACE, "-f", str(PLACEMENT_HINTS))
