"""The ResourceSlice a node publishes: one pool, one slice, GPUs by index, consumable capacity."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient

from gpufrag.nvml import NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from node.dra.cli import read_gpus
from node.dra.config import DRIVER_NAME
from node.dra.slices import MAX_DEVICES, build_slice
from node.gpus import Gpu
from tests.node.dra.builders import NODE, build_gpus

A100_MIG = Path(__file__).parents[1] / "agent" / "data" / "nvml_a100_80gb_mig.json"


def recorded_slice() -> dict[str, Any]:
    with NvmlReader(RecordedNvml.load(A100_MIG)) as reader:
        gpus, mig = read_gpus(reader)
    return build_slice(NODE, DRIVER_NAME, gpus, mig)


def test_a_recorded_node_is_one_pool_with_its_gpus_in_index_order() -> None:
    found = recorded_slice()
    spec = found["spec"]
    assert found["apiVersion"] == "resource.k8s.io/v1"
    assert found["metadata"]["name"] == f"{NODE}-{DRIVER_NAME}"
    assert spec["driver"] == DRIVER_NAME and spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert [d["attributes"]["index"] for d in spec["devices"]] == [{"int": 0}, {"int": 1}]


def test_a_gpu_outside_mig_mode_is_shared_by_milli_and_memory() -> None:
    shared = recorded_slice()["spec"]["devices"][1]  # the recording's GPU 1 is not in MIG mode
    assert shared["allowMultipleAllocations"] is True
    assert shared["attributes"] == {
        "index": {"int": 1}, "uuid": {"string": "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789a002"},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "migEnabled": {"bool": False}}
    # milli has no request policy: a request that does not name it takes all 1000 (whole GPU);
    # memory defaults to 0, so a compute share names none.
    assert shared["capacity"] == {
        "milli": {"value": "1000"},
        "memory": {"value": "81920Mi", "requestPolicy": {"default": "0"}}}


def test_a_gpu_in_mig_mode_is_one_unshared_device_until_partitions_are_built() -> None:
    mig = recorded_slice()["spec"]["devices"][0]
    assert mig["attributes"]["migEnabled"] == {"bool": True}
    assert "allowMultipleAllocations" not in mig
    assert mig["capacity"] == {"memory": {"value": "81920Mi"}}


def test_gpus_are_listed_by_index_whatever_order_they_come_in() -> None:
    gpus = list(build_gpus(4))
    random.Random(7).shuffle(gpus)
    devices = build_slice(NODE, DRIVER_NAME, gpus, {})["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_every_field_is_one_the_resource_v1_types_know() -> None:
    """Round trip through the client's v1 models: a misspelt field would be dropped."""
    built = build_slice(NODE, DRIVER_NAME, build_gpus(2), {1: True}, generation=3,
                        node_uid="node-uid-1")
    client: Any = ApiClient()  # its serialization helpers are untyped
    model = client.deserialize(json.dumps(built), "V1ResourceSlice", "application/json")
    assert client.sanitize_for_serialization(model) == built


def test_the_node_owns_its_slice_when_its_uid_is_known() -> None:
    owned = build_slice(NODE, DRIVER_NAME, build_gpus(1), {}, node_uid="u-1")
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u-1", "controller": True}]
    assert "ownerReferences" not in build_slice(NODE, DRIVER_NAME, build_gpus(1), {})["metadata"]


def test_more_gpus_than_a_slice_holds_is_refused() -> None:
    gpus = [Gpu(i, f"GPU-{i}", "p", 1024) for i in range(MAX_DEVICES + 1)]
    with pytest.raises(ValueError, match="at most 64 devices"):
        build_slice(NODE, DRIVER_NAME, gpus, {})
