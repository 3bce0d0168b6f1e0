"""Test doubles for the DRA driver: the API server's claims and slices, and NVML in MIG mode."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpufrag.nvml_recorded import (
    RecordedDevice,
    RecordedGpuInstanceProfile,
    RecordedNvml,
    RecordedSample,
)
from node.dra.slices import Obj
from node.gpus import Gpu
from scheduler.kube.errors import ApiError


@dataclass
class FakeClaims:
    """Claims by (namespace, name); a value that is an exception is raised."""

    claims: dict[tuple[str, str], Any] = field(default_factory=dict)

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        found = self.claims.get((namespace, name))
        if found is None:
            raise ApiError(f"reading ResourceClaim {namespace}/{name}", 404, "not found",
                           reason="Not Found")
        if isinstance(found, Exception):
            raise found
        return dict(found)


@dataclass
class FakeSlices:
    """The API server's slices by name; quantities come back canonical, as the server's do."""

    stored: dict[str, Obj] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    version: int = 0

    def _store(self, body: Obj) -> None:
        body = copy.deepcopy(body)
        for device in body["spec"].get("devices") or ():
            memory = device["capacity"]["memory"]
            memory["value"] = memory["value"].replace("81920Mi", "80Gi")
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.stored[body["metadata"]["name"]] = body

    def list(self, *, driver: str, node_name: str) -> list[Obj]:
        self.calls.append("list")
        return [copy.deepcopy(s) for s in self.stored.values()
                if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == node_name]

    def create(self, body: Obj) -> None:
        self.calls.append(f"create {body['metadata']['name']}")
        self._store(body)

    def replace(self, name: str, body: Obj) -> None:
        assert body["metadata"]["resourceVersion"] == self.stored[name]["metadata"][
            "resourceVersion"]
        self.calls.append(f"replace {name}")
        self._store(body)

    def delete(self, name: str) -> None:
        self.calls.append(f"delete {name}")
        del self.stored[name]


# NVML's GPU instance profiles on an A100 80GB in MIG mode (``nvidia-smi mig -lgip`` and
# ``-lgipp``): pynvml's profile index, NVML's id, compute slices, memory, memory slices, starts.
A100_80GB_PROFILES = (
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 9728, 1,
                               (0, 1, 2, 3, 4, 5, 6)),
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 19968, 2,
                               (0, 2, 4, 6)),
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 19968, 2,
                               (0, 2, 4)),
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 40192, 4, (0, 4)),
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 40192, 4, (0,)),
    RecordedGpuInstanceProfile(pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 80896, 8, (0,)),
)


def mig_nvml(gpus: Sequence[Gpu]) -> RecordedNvml:
    """An opened recorded NVML with ``gpus`` in MIG mode and no instance yet: the placement
    rules NVML enforces on an A100 80GB, for the driver's partitions."""
    nvml = RecordedNvml([RecordedDevice(
        name=gpu.product, uuid=gpu.uuid, memory_total_bytes=gpu.memory_total_mib << 20,
        samples=[RecordedSample(0, 0)], mig=[], gpu_instance_profiles=list(A100_80GB_PROFILES))
        for gpu in gpus])
    nvml.nvmlInit()
    return nvml
