"""Builders for pods asking MIG instances (nodes: ``scheduler.kube.mignodes.mig_node_to_k8s``),
shared by the kube, extender and end-to-end MIG tests."""

from __future__ import annotations

from typing import Any

from gpufrag.conventions import SCHEDULER_NAME


def mig_pod(name: str, profiles: dict[str, int], *, node: str = "", namespace: str = "default",
            cpu: str = "100m", model: str = "", version: str = "") -> dict[str, Any]:
    """A v1 Pod asking ``profiles`` (profile -> instances) as ``nvidia.com/mig-<profile>``
    limits, of gpufrag's scheduler; bound to ``node`` when given."""
    limits = {f"nvidia.com/mig-{p}": str(n) for p, n in profiles.items()}
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "main",
                        "resources": {"requests": {"cpu": cpu}, "limits": limits}}]}
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}"}
    if model:
        meta["labels"] = {"gpufrag.io/model": model, "gpufrag.io/model-version": version}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node else "Pending"}}
