"""From an allocated claim to the grant a container gets: whole GPUs, compute and memory shares,
and a precise refusal for a claim that is not this node's to prepare."""

from __future__ import annotations

import re
from typing import Any

import pytest

from node.dra.claims import ClaimProblem, allocated, prepare
from node.dra.config import DRIVER_NAME
from node.gpus import DeviceNodes
from tests.node.dra.builders import (
    MEMORY_MIB,
    NODE,
    UUIDS,
    build_claim,
    build_config,
    build_gpus,
    result,
)

GPUS = {gpu.index: gpu for gpu in build_gpus()}
NODES = DeviceNodes({0: "/dev/nvidia0", 1: "/dev/nvidia1", 2: "/dev/nvidia2"},
                    ("/dev/nvidiactl",), ())


def devices(claim: dict[str, Any], uid: str = "uid-1") -> Any:
    return allocated(claim, uid=uid, driver=DRIVER_NAME, pool=NODE, gpus=GPUS).devices


def envs(claim: dict[str, Any], **config: Any) -> dict[str, str]:
    prepared = prepare(devices(claim), nodes=NODES, config=build_config(**config))
    (grant,) = prepared.grants.values()
    return dict(grant.envs)


def test_a_whole_gpu_gets_its_uuid_its_device_node_and_no_share_limits() -> None:
    claim = build_claim([result("gpu-2", consumed={"milli": "1k", "memory": "0"})])
    prepared = prepare(devices(claim), nodes=NODES, config=build_config())
    grant = prepared.grants["gpu"]
    assert dict(grant.envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2]}
    assert grant.device_paths == ("/dev/nvidia2", "/dev/nvidiactl")


def test_a_device_that_is_not_shared_counts_as_a_whole_gpu() -> None:
    assert envs(build_claim([result("gpu-1")])) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[1]}


def test_a_compute_share_gets_its_milli_and_that_part_of_the_memory() -> None:
    claim = build_claim([result("gpu-0", consumed={"milli": "300", "memory": "0"},
                                share_id="abc12")])
    assert devices(claim)[0].share_id == "abc12"
    assert envs(claim) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[0], "GPUFRAG_GPU_MILLI": "300",
                           "GPUFRAG_GPU_MEMORY_LIMIT_MIB": str(MEMORY_MIB * 300 // 1000)}


def test_a_memory_share_is_counted_at_least_as_its_memory_and_limited_to_it() -> None:
    claim = build_claim([result("gpu-0", consumed={"milli": "100", "memory": "40Gi"})])
    assert envs(claim, mps=True) == {
        "NVIDIA_VISIBLE_DEVICES": UUIDS[0], "GPUFRAG_GPU_MILLI": "500",
        "GPUFRAG_GPU_MEMORY_LIMIT_MIB": "40960", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=40960M"}


def test_a_request_of_two_gpus_gets_both_whole_in_one_grant() -> None:
    claim = build_claim([result("gpu-0"), result("gpu-1")])
    prepared = prepare(devices(claim), nodes=NODES, config=build_config())
    assert list(prepared.grants) == ["gpu"]
    assert dict(prepared.grants["gpu"].envs) == {
        "NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[1]}"}


def test_two_requests_get_one_grant_each() -> None:
    claim = build_claim([result("gpu-0", request="a"),
                         result("gpu-3", request="b", consumed={"milli": "250"})])
    prepared = prepare(devices(claim), nodes=NODES, config=build_config())
    assert prepared.grants["a"].envs == {"NVIDIA_VISIBLE_DEVICES": UUIDS[0]}
    assert prepared.grants["b"].envs["GPUFRAG_GPU_MILLI"] == "250"


def test_another_drivers_devices_are_left_to_it() -> None:
    claim = build_claim([result("gpu-0"), result("nic-0", driver="nic.example.com")])
    assert [d.device for d in devices(claim)] == ["gpu-0"]


@pytest.mark.parametrize(("claim", "uid", "message"), [
    (build_claim(allocated=False), "uid-1", "status.allocation is not set"),
    (build_claim(), "uid-2", "metadata.uid is 'uid-1', the kubelet asked for 'uid-2'"),
    (build_claim([result(pool="gpu-node-2")]), "uid-1",
     "results[0].pool is 'gpu-node-2', but this node's pool is 'gpu-node-1'"),
    (build_claim([result("gpu-7")]), "uid-1", "results[0].device 'gpu-7' is not a GPU of this"),
    (build_claim([result(consumed={"milli": "lots"})]), "uid-1",
     "results[0].consumedCapacity.milli"),
    (build_claim([result(consumed={"milli": "1500"})]), "uid-1",
     "milli': 1500; it must be 1..1000"),
    (build_claim([result(consumed={"memory": "100Gi"})]), "uid-1",
     "memory is 102400 MiB; GPU 0 has 81920 MiB"),
    (build_claim([result(driver="other.example.com")]), "uid-1",
     "the allocation has no device of driver 'gpu.gpufrag.io'"),
])
def test_a_claim_that_is_not_this_nodes_to_prepare_is_refused_naming_the_field(
        claim: dict[str, Any], uid: str, message: str) -> None:
    with pytest.raises(ClaimProblem, match=re.escape(message)):
        devices(claim, uid)


def test_a_mig_partition_is_read_as_its_placement_on_this_nodes_gpu() -> None:
    claim = build_claim([result("gpu-1-mig-3g-40gb-4", request="mig")])
    found = allocated(claim, uid="uid-1", driver=DRIVER_NAME, pool=NODE, gpus=GPUS)
    assert found.devices == ()
    (part,) = found.partitions
    assert (part.request, part.gpu.index, part.profile.name, part.start) == (
        "mig", 1, "3g.40gb", 4)


@pytest.mark.parametrize(("device", "why"), [
    ("gpu-1-mig-3g-40gb-2", "no MIG profile 3g.40gb at slice 2"),  # not a legal start
    ("gpu-1-mig-1g-5gb-0", "no MIG profile 1g.5gb"),  # an A100 40GB's profile, not an 80GB's
    ("gpu-9-mig-1g-10gb-0", "'gpu-9-mig-1g-10gb-0' is not a GPU of this node"),
])
def test_a_partition_this_node_cannot_hold_is_refused_by_name(device: str, why: str) -> None:
    with pytest.raises(ClaimProblem, match=re.escape(why)):
        allocated(build_claim([result(device)]), uid="uid-1", driver=DRIVER_NAME, pool=NODE,
                  gpus=GPUS)
