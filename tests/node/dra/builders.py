"""Builders for the DRA driver's unit tests: GPUs, settings and claims as the API serves them.

Every field has a default; keyword overrides change only what a test is about.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from node.dra.config import DRIVER_NAME, DraConfig
from node.gpus import Gpu

NODE = "gpu-node-1"
UUIDS = ("GPU-00000000-0000-4000-8000-000000000000", "GPU-11111111-1111-4111-8111-111111111111",
         "GPU-22222222-2222-4222-8222-222222222222", "GPU-33333333-3333-4333-8333-333333333333")
MEMORY_MIB = 81_920


def build_gpus(count: int = 4) -> tuple[Gpu, ...]:
    return tuple(Gpu(i, UUIDS[i], "NVIDIA A100-SXM4-80GB", MEMORY_MIB) for i in range(count))


def build_config(**overrides: Any) -> DraConfig:
    return DraConfig(node_name=NODE, **overrides).validate()


def result(device: str = "gpu-0", *, request: str = "gpu", driver: str = DRIVER_NAME,
           pool: str = NODE, consumed: Mapping[str, str] | None = None,
           share_id: str | None = None) -> dict[str, Any]:
    """One entry of ``status.allocation.devices.results``."""
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool,
                             "device": device}
    if consumed is not None:
        entry["consumedCapacity"] = dict(consumed)
    if share_id is not None:
        entry["shareID"] = share_id
    return entry


def build_claim(results: Sequence[Mapping[str, Any]] | None = None, *, uid: str = "uid-1",
                name: str = "claim-1", namespace: str = "default",
                allocated: bool = True) -> dict[str, Any]:
    """A ResourceClaim as the API serves it, allocated by kube-scheduler to ``results``
    (default: one whole GPU, gpu-0)."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.gpufrag.io"}}]}},
        "status": {},
    }
    if allocated:
        claim["status"]["allocation"] = {
            "devices": {"results": [dict(r) for r in (results or [result()])]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }
    return claim
