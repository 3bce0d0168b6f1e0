"""The ResourceSlices a node publishes: one pool; GPUs by index with consumable capacity in one
slice; a GPU in MIG mode as a counter set of its memory slices and one partition per legal
placement, split over slices within the v1 API's limits."""

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
from node.dra.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    TAINT_UNHEALTHY,
    build_slice,
    build_slices,
)
from node.gpus import Gpu
from scheduler.core.mig import MIG_MODELS, placements, start_order
from tests.node.dra.builders import NODE, build_gpus

A100_MIG = Path(__file__).parents[1] / "agent" / "data" / "nvml_a100_80gb_mig.json"


A100 = "NVIDIA A100-SXM4-80GB"


def recorded_slices() -> list[dict[str, Any]]:
    with NvmlReader(RecordedNvml.load(A100_MIG)) as reader:
        gpus, mig = read_gpus(reader)
    return build_slices(NODE, DRIVER_NAME, gpus, mig)


def recorded_slice() -> dict[str, Any]:
    """The slice of the recorded node's GPUs outside MIG mode."""
    return recorded_slices()[0]


def test_a_recorded_node_is_one_pool_of_three_slices() -> None:
    found = recorded_slices()
    assert [s["metadata"]["name"] for s in found] == [
        f"{NODE}-{DRIVER_NAME}", f"{NODE}-{DRIVER_NAME}-counters-0", f"{NODE}-{DRIVER_NAME}-mig-0"]
    for each in found:
        spec = each["spec"]
        assert each["apiVersion"] == "resource.k8s.io/v1"
        assert spec["driver"] == DRIVER_NAME and spec["nodeName"] == NODE
        assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 3}
        assert ("devices" in spec) != ("sharedCounters" in spec)  # v1: one or the other
    assert [d["name"] for d in found[0]["spec"]["devices"]] == ["gpu-1"]  # GPU 0 is in MIG mode


def test_a_gpu_outside_mig_mode_is_shared_by_milli_and_memory() -> None:
    (shared,) = recorded_slice()["spec"]["devices"]  # the recording's GPU 1 is not in MIG mode
    assert shared["allowMultipleAllocations"] is True
    assert shared["attributes"] == {
        "index": {"int": 1}, "uuid": {"string": "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789a002"},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "migEnabled": {"bool": False}}
    # milli has no request policy: a request that does not name it takes all 1000 (whole GPU);
    # memory defaults to 0, so a compute share names none.
    assert shared["capacity"] == {
        "milli": {"value": "1000"},
        "memory": {"value": "81920Mi", "requestPolicy": {"default": "0"}}}


def test_a_gpu_in_mig_mode_is_a_counter_set_of_its_eight_memory_slices() -> None:
    counters = recorded_slices()[1]["spec"]["sharedCounters"]
    assert counters == [{"name": "gpu-0-slices", "counters": {
        f"memory-slice-{i}": {"value": "1"} for i in range(8)}}]


def test_each_legal_placement_is_a_partition_consuming_the_slices_it_covers() -> None:
    partitions = recorded_slices()[2]["spec"]["devices"]
    model = MIG_MODELS["A100-80GB"]
    assert len(partitions) == sum(len(p.starts) for p in model.profiles) == 18
    by_name = {d["name"]: d for d in partitions}
    three = by_name["gpu-0-mig-3g-40gb-4"]
    assert three["attributes"] == {
        "index": {"int": 0}, "uuid": {"string": "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789a001"},
        "productName": {"string": A100}, "migEnabled": {"bool": True},
        "profile": {"string": "3g.40gb"}, "migStart": {"int": 4}}
    assert three["capacity"] == {"memory": {"value": "40960Mi"}}
    assert three["consumesCounters"] == [{"counterSet": "gpu-0-slices", "counters": {
        f"memory-slice-{i}": {"value": "1"} for i in (4, 5, 6, 7)}}]
    assert "allowMultipleAllocations" not in three
    for profile in model.profiles:  # every legal start, each covering exactly its slices
        for start in placements(profile, 0):
            device = by_name[f"gpu-0-mig-{profile.name.replace('.', '-')}-{start}"]
            (consumed,) = device["consumesCounters"]
            assert sorted(consumed["counters"]) == [
                f"memory-slice-{i}" for i in range(start, start + profile.slices)]


def test_first_fit_meets_each_profiles_starts_in_the_mig_tables_order() -> None:
    """Within a GPU, a profile's placements come in start_order: the top of the GPU first for
    the small profiles (a 3g at 4 before 0, a 1g at 6 first)."""
    partitions = recorded_slices()[2]["spec"]["devices"]
    model = MIG_MODELS["A100-80GB"]
    for profile in model.profiles:
        starts = [d["attributes"]["migStart"]["int"] for d in partitions
                  if d["attributes"]["profile"]["string"] == profile.name]
        assert tuple(starts) == start_order(model, profile)
    assert start_order(model, model.profile("3g.40gb") or model.profiles[0]) == (4, 0)


def test_eight_mig_gpus_split_over_slices_within_the_apis_limits() -> None:
    gpus = [Gpu(i, f"GPU-{i}", A100, 81_920) for i in range(8)]
    found = build_slices(NODE, DRIVER_NAME, gpus, {i: True for i in range(8)})
    names = [s["metadata"]["name"] for s in found]
    assert names == [f"{NODE}-{DRIVER_NAME}-counters-0"] + [
        f"{NODE}-{DRIVER_NAME}-mig-{k}" for k in range(3)]  # no GPU outside MIG mode
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in found} == {4}
    assert len(found[0]["spec"]["sharedCounters"]) == 8 <= MAX_COUNTER_SETS
    sizes = [len(s["spec"]["devices"]) for s in found[1:]]
    assert sizes == [54, 54, 36] and max(sizes) <= MAX_DEVICES  # 3 GPUs of 18 a slice
    gpu_order = [d["attributes"]["index"]["int"] for s in found[1:] for d in s["spec"]["devices"]]
    assert gpu_order == sorted(gpu_order)  # GPU by GPU, each whole in one slice
    nine = build_slices(NODE, DRIVER_NAME, [*gpus, Gpu(8, "GPU-8", A100, 81_920)],
                        {i: True for i in range(9)})
    assert [len(s["spec"].get("sharedCounters") or ()) for s in nine[:2]] == [8, 1]


def test_a_mig_gpu_the_table_does_not_cover_stays_one_unshared_device() -> None:
    gpus = [Gpu(0, "GPU-0", "NVIDIA L4", 23_034)]
    (only,) = build_slices(NODE, DRIVER_NAME, gpus, {0: True})
    (device,) = only["spec"]["devices"]
    assert device["attributes"]["migEnabled"] == {"bool": True}
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "23034Mi"}}


def test_build_slice_refuses_a_pool_of_several_slices() -> None:
    with pytest.raises(ValueError, match="the pool has 3 slices"):
        build_slice(NODE, DRIVER_NAME, build_gpus(2), {1: True})


def test_gpus_are_listed_by_index_whatever_order_they_come_in() -> None:
    gpus = list(build_gpus(4))
    random.Random(7).shuffle(gpus)
    devices = build_slice(NODE, DRIVER_NAME, gpus, {})["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_every_field_is_one_the_resource_v1_types_know() -> None:
    """Round trip through the client's v1 models: a misspelt field would be dropped."""
    client: Any = ApiClient()  # its serialization helpers are untyped
    for built in build_slices(NODE, DRIVER_NAME, build_gpus(2), {1: True}, generation=3,
                              node_uid="node-uid-1"):
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


def test_an_unhealthy_gpus_devices_carry_a_noschedule_taint() -> None:
    gpus = [Gpu(0, "GPU-0", A100, 81_920), Gpu(1, "GPU-1", A100, 81_920)]
    taint = [{"key": TAINT_UNHEALTHY, "effect": "NoSchedule"}]
    whole, _counters, partitions = build_slices(NODE, DRIVER_NAME, gpus, {1: True},
                                                unhealthy={0, 1})
    assert [d.get("taints") for d in whole["spec"]["devices"]] == [taint]
    assert {str(d.get("taints")) for d in partitions["spec"]["devices"]} == {str(taint)}
    healthy = build_slices(NODE, DRIVER_NAME, gpus, {1: True}, unhealthy={1})[0]
    assert "taints" not in healthy["spec"]["devices"][0]
    client: Any = ApiClient()  # the v1 models know the field
    for built in (whole, partitions):
        model = client.deserialize(json.dumps(built), "V1ResourceSlice", "application/json")
        assert client.sanitize_for_serialization(model) == built
