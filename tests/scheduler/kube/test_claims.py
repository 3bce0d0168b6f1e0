"""The one reader of DRA allocations: which GPUs, on which node, and how much of each a pod holds
through gpufrag's driver; other drivers skipped; malformed input refused naming the field."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpufrag.errors import BadInput
from node.dra.slices import build_slice, build_slices
from node.gpus import Gpu
from scheduler.core.types import MAX_GPUS_PER_NODE, NodeSpec, PodRequest
from scheduler.kube.claims import (
    AskedGpus,
    ClaimedGpu,
    ClaimedPartition,
    HeldGpu,
    MigPartition,
    SliceGpus,
    SliceMigGpu,
    asked_gpus,
    claimed_gpus,
    claimed_partitions,
    device_index,
    device_name,
    gpus_asked,
    held_gpus,
    listed_pod_gpus,
    listed_pod_partitions,
    mapped_count,
    mapped_resource,
    mig_class_name,
    mig_class_profile,
    mig_device_name,
    mig_partition,
    partitions_asked,
    pod_claim_names,
    slice_gpus,
    slice_mig_gpus,
    with_slice_gpus,
)

DRIVER = "gpu.gpufrag.io"
NODE = "gpu-node-1"


def result(device: str = "gpu-0", *, driver: str = DRIVER, pool: str = NODE,
           request: str = "gpu", consumed: dict[str, Any] | None = None,
           share_id: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool,
                             "device": device}
    if consumed is not None:
        entry["consumedCapacity"] = consumed
    if share_id is not None:
        entry["shareID"] = share_id
    return entry


def build_claim(*results: dict[str, Any], allocated: bool = True) -> dict[str, Any]:
    claim: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                             "metadata": {"name": "claim-1", "namespace": "default"},
                             "status": {}}
    if allocated:
        claim["status"]["allocation"] = {"devices": {"results": list(results)}}
    return claim


def build_pod(*claims: tuple[str, str | None, str | None]) -> dict[str, Any]:
    """A pod whose ``spec.resourceClaims`` are (entry name, resourceClaimName, generated name
    in ``status.resourceClaimStatuses``)."""
    spec_claims, statuses = [], []
    for name, direct, generated in claims:
        entry: dict[str, Any] = {"name": name}
        if direct:
            entry["resourceClaimName"] = direct
        else:
            entry["resourceClaimTemplateName"] = "gpu-template"
            if generated:
                statuses.append({"name": name, "resourceClaimName": generated})
        spec_claims.append(entry)
    return {"metadata": {"name": "p", "namespace": "default"},
            "spec": {"nodeName": NODE, "resourceClaims": spec_claims},
            "status": {"resourceClaimStatuses": statuses}}


def test_a_result_that_consumed_no_capacity_is_the_whole_gpu() -> None:
    assert claimed_gpus(build_claim(result("gpu-1")), driver=DRIVER) == (
        ClaimedGpu(0, "gpu", NODE, "gpu-1", 1, 1000, 0, None),)


def test_a_milli_share_and_a_memory_share_read_their_consumed_capacity() -> None:
    claim = build_claim(result("gpu-0", consumed={"milli": "250"}, share_id="s1"),
                        result("gpu-2", request="mem", consumed={"milli": "500",
                                                                 "memory": "40Gi"}))
    first, second = claimed_gpus(claim, driver=DRIVER) or ()
    assert (first.index, first.milli, first.memory_mib, first.share_id) == (0, 250, 0, "s1")
    assert (second.index, second.milli, second.memory_mib, second.request) == (
        2, 500, 40 * 1024, "mem")


def test_memory_in_bytes_rounds_up_to_whole_mib() -> None:
    (gpu,) = claimed_gpus(build_claim(result(consumed={"memory": "1048577"})),
                          driver=DRIVER) or ()
    assert gpu.memory_mib == 2


def test_another_drivers_results_are_skipped() -> None:
    claim = build_claim(result("nic-0", driver="nic.example.com", pool="x"), result("gpu-3"))
    assert [(g.result, g.index) for g in claimed_gpus(claim, driver=DRIVER) or ()] == [(1, 3)]


def test_an_unallocated_claim_holds_nothing() -> None:
    assert claimed_gpus(build_claim(allocated=False), driver=DRIVER) is None


@pytest.mark.parametrize(("claim", "field"), [
    ({"status": "x"}, "status"),
    ({"status": {"allocation": []}}, "status.allocation"),
    ({"status": {"allocation": {"devices": {"results": "r"}}}},
     "status.allocation.devices.results"),
    (build_claim("r"), "status.allocation.devices.results[0]"),  # type: ignore[arg-type]
    (build_claim(result("gpu-x")), "status.allocation.devices.results[0].device"),
    (build_claim(result(pool="")), "status.allocation.devices.results[0].pool"),
    (build_claim(result(request="")), "status.allocation.devices.results[0].request"),
    (build_claim(result(consumed="all")),  # type: ignore[arg-type]
     "status.allocation.devices.results[0].consumedCapacity"),
    (build_claim(result(consumed={"milli": "lots"})),
     "status.allocation.devices.results[0].consumedCapacity.milli"),
    (build_claim(result(consumed={"milli": "1500"})),
     "status.allocation.devices.results[0].consumedCapacity.milli"),
    (build_claim(result(consumed={"milli": "0"})),
     "status.allocation.devices.results[0].consumedCapacity.milli"),
    (build_claim(result(consumed={"memory": "-1Gi"})),
     "status.allocation.devices.results[0].consumedCapacity.memory"),
])
def test_malformed_allocations_are_bad_input_naming_the_field(claim: dict[str, Any],
                                                               field: str) -> None:
    with pytest.raises(BadInput, match=re.escape(f"field {field!r}")):
        claimed_gpus(claim, driver=DRIVER)


def test_a_pod_names_direct_claims_and_generated_ones_once_made() -> None:
    pod = build_pod(("a", "shared-claim", None), ("b", None, "p-b-x7"), ("c", None, None))
    assert pod_claim_names(pod) == ("shared-claim", "p-b-x7")


def test_a_pod_asking_a_mapped_extended_resource_names_the_claim_made_for_it() -> None:
    """KEP-5004: kube-scheduler makes the claim while binding and names it in the pod's
    status; until then the pod names none."""
    pod = build_pod(("a", None, "p-a-x7"))
    assert pod_claim_names(pod) == ("p-a-x7",)
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "p-extended-resources-k2",
        "requestMappings": [{"containerName": "c", "resourceName": "gpufrag.io/dra-gpu",
                             "requestName": "container-0-request-0"}]}
    assert pod_claim_names(pod) == ("p-a-x7", "p-extended-resources-k2")
    assert pod_claim_names({"spec": {}, "status": {"extendedResourceClaimStatus": {
        "resourceClaimName": "only"}}}) == ("only",)


@pytest.mark.parametrize(("pod", "field"), [
    ({"status": {"extendedResourceClaimStatus": ["x"]}}, "status.extendedResourceClaimStatus"),
    ({"status": {"extendedResourceClaimStatus": {"resourceClaimName": 7}}},
     "status.extendedResourceClaimStatus.resourceClaimName"),
    ({"spec": {"resourceClaims": {"a": 1}}}, "spec.resourceClaims"),
    ({"spec": {"resourceClaims": ["a"]}}, "spec.resourceClaims[0]"),
    ({"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": 3}]}},
     "spec.resourceClaims[0].resourceClaimName"),
    ({"status": {"resourceClaimStatuses": [{"name": 1}]}},
     "status.resourceClaimStatuses[0].name"),
])
def test_malformed_pod_claim_fields_are_bad_input_naming_the_field(pod: dict[str, Any],
                                                                   field: str) -> None:
    with pytest.raises(BadInput, match=re.escape(f"field {field!r}")):
        pod_claim_names(pod)


def test_a_pod_holds_its_claims_gpus_with_shares_on_one_gpu_added_up() -> None:
    pod = build_pod(("a", None, "claim-a"), ("b", "claim-b", None), ("c", None, "missing"))
    claims = {
        "claim-a": build_claim(result("gpu-1", consumed={"milli": "300", "memory": "1Gi"})),
        "claim-b": build_claim(result("gpu-1", consumed={"milli": "200"}), result("gpu-0")),
        "unrelated": build_claim(result("gpu-5")),
    }
    assert held_gpus(pod, claims, driver=DRIVER) == (
        HeldGpu(NODE, 0, 1000, 0), HeldGpu(NODE, 1, 500, 1024))


def test_a_pod_whose_claim_is_malformed_is_bad_input_naming_the_claim() -> None:
    pod = build_pod(("a", "claim-a", None))
    with pytest.raises(BadInput, match="ResourceClaim 'claim-a'.*results\\[0\\].device"):
        held_gpus(pod, {"claim-a": build_claim(result("gpu-x"))}, driver=DRIVER)


@pytest.mark.parametrize(("name", "index"), [
    ("gpu-0", 0), ("gpu-15", 15), ("gpu-01", None), ("gpu-", None), ("cpu-1", None),
    ("gpu-x", None), ("xgpu-1", None), ("gpu--1", None)])
def test_device_names_read_back_to_their_index(name: str, index: int | None) -> None:
    assert device_index(name) == index
    if index is not None:
        assert device_name(index) == name


# ---------------------------------------------------------------------- what a claim asks
CLASSES = ("gpu.gpufrag.io", "whole.gpu.gpufrag.io")


def ask(name: str = "gpu", device_class: str = "gpu.gpufrag.io", **exactly: Any
        ) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": device_class, **exactly}}


def asking(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "claim-1", "namespace": "default"},
            "spec": {"devices": {"requests": list(requests)}}}


@pytest.mark.parametrize(("request_", "expected"), [
    (ask(), AskedGpus("gpu", 1, 1000, 0)),  # no milli named: all of it, a whole GPU
    (ask(capacity={"requests": {"milli": "250"}}), AskedGpus("gpu", 1, 250, 0)),
    (ask(capacity={"requests": {"milli": "300", "memory": "20Gi"}}),
     AskedGpus("gpu", 1, 300, 20_480)),
    (ask(capacity={"requests": {"memory": "1Gi"}}), AskedGpus("gpu", 1, 1000, 1024)),
    (ask(count=2, allocationMode="ExactCount"), AskedGpus("gpu", 2, 1000, 0)),
    (ask(device_class="whole.gpu.gpufrag.io"), AskedGpus("gpu", 1, 1000, 0)),
])
def test_a_request_of_our_classes_asks_its_gpus(request_: dict[str, Any],
                                                expected: AskedGpus) -> None:
    assert asked_gpus(asking(request_), device_classes=CLASSES) == (expected,)


def test_requests_of_other_classes_and_claims_without_a_spec_ask_nothing() -> None:
    assert asked_gpus(asking(ask(device_class="nic.example.com")), device_classes=CLASSES) == ()
    assert asked_gpus({"metadata": {"name": "c"}}, device_classes=CLASSES) == ()
    assert gpus_asked([("c", asking(ask(device_class="nic.example.com")))],
                      device_classes=CLASSES) == (0, 0)


def test_a_pods_claims_ask_one_share_or_whole_gpus() -> None:
    share = asking(ask(capacity={"requests": {"milli": "400"}}))
    assert gpus_asked([("a", share)], device_classes=CLASSES) == (1, 400)
    # Two shares (two claims) count as two whole GPUs, as two allocated results do.
    assert gpus_asked([("a", share), ("b", share)], device_classes=CLASSES) == (2, 1000)
    assert gpus_asked([("a", asking(ask(count=3)))], device_classes=CLASSES) == (3, 1000)


@pytest.mark.parametrize(("request_", "field"), [
    (ask(allocationMode="All"), "spec.devices.requests[0].exactly.allocationMode"),
    (ask(count=0), "spec.devices.requests[0].exactly.count"),
    (ask(count="2"), "spec.devices.requests[0].exactly.count"),
    (ask(count=2, capacity={"requests": {"milli": "500"}}),
     "spec.devices.requests[0].exactly.count"),
    (ask(capacity={"requests": {"milli": "1500"}}),
     "spec.devices.requests[0].exactly.capacity.requests.milli"),
    (ask(capacity={"requests": {"milli": "lots"}}),
     "spec.devices.requests[0].exactly.capacity.requests.milli"),
    ({"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.gpufrag.io"}]},
     "spec.devices.requests[0].firstAvailable"),
    ({"exactly": {"deviceClassName": "gpu.gpufrag.io"}}, "spec.devices.requests[0].name"),
    ("gpu", "spec.devices.requests[0]"),
])
def test_an_ask_placement_cannot_model_is_refused_naming_the_field(
        request_: Any, field: str) -> None:
    with pytest.raises(BadInput, match=re.escape(field)):
        asked_gpus(asking(request_), device_classes=CLASSES)


def test_more_gpus_than_a_node_has_are_refused() -> None:
    with pytest.raises(BadInput, match="claims ask 17 GPUs; a node has at most 16"):
        gpus_asked([("big", asking(ask(count=17)))], device_classes=CLASSES)


# ---------------------------------------------------------------------- a listed cluster's pods
def listed_pod(node: str = "") -> dict[str, Any]:
    pod = build_pod(("gpu", None, "claim-1"))
    pod["spec"]["nodeName"] = node
    return pod


def allocated_asking(*results: dict[str, Any]) -> dict[str, Any]:
    claim = build_claim(*results, allocated=bool(results))
    claim["spec"] = asking(ask(capacity={"requests": {"milli": "250"}}))["spec"]
    return claim


BASE = PodRequest("p", cpu_milli=1000, namespace="default")


def test_a_listed_pod_without_claims_is_not_read_through_them() -> None:
    assert listed_pod_gpus({"metadata": {"name": "p", "namespace": "default"}, "spec": {}},
                           BASE, {}) is None


def test_a_bound_pod_holds_its_allocation_on_its_node_and_a_pending_one_asks() -> None:
    claims = {"default/claim-1": allocated_asking(result("gpu-3", consumed={"milli": "250"}))}
    request, record = listed_pod_gpus(listed_pod(NODE), BASE, claims) or (None, None)
    assert request is not None and (request.num_gpu, request.gpu_milli, record) == (1, 250, (3,))
    pending = {"default/claim-1": allocated_asking()}
    request, record = listed_pod_gpus(listed_pod(), BASE, pending) or (None, None)
    assert request is not None and (request.num_gpu, request.gpu_milli, record) == (1, 250, None)


def test_a_bound_pod_whose_claims_show_no_allocation_there_holds_no_gpu() -> None:
    for claims in ({}, {"default/claim-1": allocated_asking()},
                   {"default/claim-1": allocated_asking(result("gpu-0", pool="other-node"))}):
        request, record = listed_pod_gpus(listed_pod(NODE), BASE, claims) or (None, None)
        assert request is not None and (request.num_gpu, record) == (0, ()), claims


# ---------------------------------------------------------------------- what a slice offers
def a100s(count: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81_920) for i in range(count)]


def test_a_slice_offers_its_gpus_as_the_driver_publishes_them() -> None:
    # GPU 3 in MIG mode: its partitions and counters are slices of their own, none a GPU.
    published, counters, partitions = build_slices(NODE, DRIVER, a100s(4), {3: True})
    assert slice_gpus(published, driver=DRIVER) == SliceGpus(NODE, 3, "NVIDIA A100-SXM4-80GB",
                                                             81_920)
    assert slice_gpus(counters, driver=DRIVER) == SliceGpus(NODE, 0, "", 0)
    assert slice_gpus(partitions, driver=DRIVER) == SliceGpus(NODE, 0, "", 0)
    assert slice_gpus(published, driver="other.example.com") is None


def test_a_mig_partitions_name_reads_back_as_its_placement() -> None:
    name = mig_device_name(3, "3g.40gb", 4)
    assert name == "gpu-3-mig-3g-40gb-4"
    assert mig_partition(name) == MigPartition(3, "3g.40gb", 4)
    assert device_index(name) is None  # not a GPU: no reader counts it as one
    for other in ("gpu-3", "gpu-03-mig-3g-40gb-4", "gpu-3-mig-3g-40gb-8", "gpu-3-mig-3g.40gb-4"):
        assert mig_partition(other) is None, other


def test_a_claims_partitions_are_read_apart_from_its_gpus() -> None:
    claim = build_claim(result("gpu-1-mig-1g-10gb-6", request="mig"), result("gpu-0"),
                        result("gpu-2-mig-1g-10gb-6", driver="other.example.com"))
    assert [g.device for g in claimed_gpus(claim, driver=DRIVER) or ()] == ["gpu-0"]
    assert claimed_partitions(claim, driver=DRIVER) == (ClaimedPartition(
        0, "mig", NODE, "gpu-1-mig-1g-10gb-6", MigPartition(1, "1g.10gb", 6)),)
    assert claimed_partitions({"status": {}}, driver=DRIVER) == ()
    broken = build_claim(result("gpu-1-mig-1g-10gb-6", pool=""))
    with pytest.raises(BadInput, match=re.escape("status.allocation.devices.results[0].pool")):
        claimed_partitions(broken, driver=DRIVER)


def test_a_bound_pod_holds_its_claims_partitions_on_its_node_only() -> None:
    claims = {"default/claim-1": build_claim(
        result("gpu-1-mig-3g-40gb-4"), result("gpu-0-mig-1g-10gb-6"), result("gpu-0"),
        result("gpu-0-mig-4g-40gb-0", pool="other-node"),
        result("gpu-0-mig-7g-80gb-0", driver="other.example.com"))}
    assert listed_pod_partitions(listed_pod(NODE), claims) == (
        MigPartition(0, "1g.10gb", 6), MigPartition(1, "3g.40gb", 4))
    assert listed_pod_partitions(listed_pod(), claims) == ()  # pending: holds nothing yet
    assert listed_pod_partitions(listed_pod(NODE), {}) == ()  # its claim not listed
    broken = {"default/claim-1": build_claim(result("gpu-1-mig-3g-40gb-4", request=""))}
    with pytest.raises(BadInput, match=re.escape(
            "ResourceClaim 'default/claim-1': field 'status.allocation.devices.results[0]"
            ".request'")):
        listed_pod_partitions(listed_pod(NODE), broken)


def test_a_slice_of_partitions_names_its_mig_gpus_and_their_memory() -> None:
    gpus = [*a100s(2), Gpu(2, "GPU-2", "NVIDIA A100-SXM4-40GB", 40_960)]
    published, counters, partitions = build_slices(NODE, DRIVER, gpus, {1: True, 2: True})
    assert slice_mig_gpus(partitions, driver=DRIVER) == (
        SliceMigGpu(NODE, 1, "NVIDIA A100-SXM4-80GB", 81_920),
        SliceMigGpu(NODE, 2, "NVIDIA A100-SXM4-40GB", 40_960))
    assert slice_mig_gpus(published, driver=DRIVER) == ()  # whole GPUs: no partition
    assert slice_mig_gpus(counters, driver=DRIVER) == ()
    assert slice_mig_gpus(partitions, driver="other.example.com") == ()
    partitions["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    with pytest.raises(BadInput, match=re.escape("spec.devices[0].capacity.memory.value")):
        slice_mig_gpus(partitions, driver=DRIVER)


def test_a_node_without_gpus_takes_its_slices_and_keeps_its_labels_names() -> None:
    offered = SliceGpus(NODE, 2, "NVIDIA A100-SXM4-80GB", 81_920)
    bare = NodeSpec(NODE, cpu_milli=1000, memory_mib=1024, gpu_count=0)
    assert with_slice_gpus(bare, offered) == NodeSpec(
        NODE, cpu_milli=1000, memory_mib=1024, gpu_count=2,
        gpu_product="NVIDIA A100-SXM4-80GB", gpu_memory_mib=81_920)
    labelled = NodeSpec(NODE, cpu_milli=1000, memory_mib=1024, gpu_count=0, gpu_memory_mib=80_000,
                        labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    merged = with_slice_gpus(labelled, offered)
    assert (merged.gpu_count, merged.gpu_product, merged.gpu_memory_mib) == (
        2, "NVIDIA-A100-SXM4-80GB", 80_000)
    advertised = NodeSpec(NODE, cpu_milli=1000, memory_mib=1024, gpu_count=4, gpu_product="T4")
    assert with_slice_gpus(advertised, offered) is advertised  # the Node's own GPUs stand
    assert with_slice_gpus(bare, None) is bare


def test_an_unreadable_slice_is_refused_naming_the_field() -> None:
    broken = build_slice(NODE, DRIVER, a100s(1), {})
    broken["spec"]["devices"][0]["capacity"]["memory"]["value"] = "lots"
    with pytest.raises(BadInput, match=re.escape("spec.devices[0].capacity.memory.value")):
        slice_gpus(broken, driver=DRIVER)


MAPPED = "gpufrag.io/dra-gpu"


def mapped_pod(*limits: str, init: str | None = None) -> dict[str, Any]:
    """A pod whose containers ask ``limits`` of the mapped resource (limits only: Kubernetes
    defaults requests to them), with no claim in its spec."""
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": f"c{i}", "resources": {"limits": {MAPPED: n}}}
                                for i, n in enumerate(limits)]}}
    if init is not None:
        pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {MAPPED: init}}}]
    return pod


def test_a_device_class_maps_the_extended_resource_it_names() -> None:
    assert mapped_resource({"spec": {"extendedResourceName": MAPPED}}) == MAPPED
    assert mapped_resource({"spec": {"selectors": []}}) is None
    with pytest.raises(BadInput, match="spec.extendedResourceName"):
        mapped_resource({"spec": {"extendedResourceName": 5}})


def test_a_pod_asks_the_devices_of_a_mapped_resource_until_its_claim_is_made() -> None:
    """Containers add up, an init container counts as the largest; once kube-scheduler names
    the claim it made in the pod's status, the claim is what is read, not the resource."""
    assert mapped_count(mapped_pod("1", "2"), {MAPPED}) == 3
    assert mapped_count(mapped_pod("1", init="2"), {MAPPED}) == 2
    assert mapped_count(mapped_pod("1"), {"example.com/other"}) == 0
    assert mapped_count(mapped_pod("1"), set()) == 0
    made = mapped_pod("1")
    made["status"] = {"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-k2"}}
    assert mapped_count(made, {MAPPED}) == 0
    with pytest.raises(BadInput, match="whole numbers"):
        mapped_count(mapped_pod("500m"), {MAPPED})


def test_mapped_gpus_are_whole_and_add_to_what_claims_ask() -> None:
    share = {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DRIVER, "capacity": {"requests": {"milli": "250"}}}}]}}}
    assert gpus_asked([], device_classes={DRIVER}, mapped=1) == (1, 1000)
    assert gpus_asked([("c", share)], device_classes={DRIVER}) == (1, 250)
    assert gpus_asked([("c", share)], device_classes={DRIVER}, mapped=1) == (2, 1000)
    with pytest.raises(BadInput, match="at most"):
        gpus_asked([], device_classes={DRIVER}, mapped=MAX_GPUS_PER_NODE + 1)


# ---------------------------------------------------------------------- MIG profiles asked
def test_a_mig_class_names_its_profile() -> None:
    assert mig_class_profile(mig_class_name("3g.40gb")) == "3g.40gb"
    for other in (DRIVER, "whole.gpu.gpufrag.io", "mig-3g.40gb.other.example.com",
                  "mig-lots.gpu.gpufrag.io"):
        assert mig_class_profile(other) is None, other


def test_claims_ask_mig_partitions_by_profile_and_nothing_else() -> None:
    claims = [("a", asking(ask(device_class=mig_class_name("3g.40gb")),
                           ask("two", device_class=mig_class_name("1g.10gb"), count=2),
                           ask("share", capacity={"requests": {"milli": "250"}}))),
              ("b", asking(ask(device_class=mig_class_name("3g.40gb"))))]
    assert partitions_asked(claims, driver=DRIVER) == {"3g.40gb": 2, "1g.10gb": 2}
    assert partitions_asked([("c", {})], driver=DRIVER) == {}
    every = asking(ask(device_class=mig_class_name("3g.40gb"), allocationMode="All"))
    with pytest.raises(BadInput, match=re.escape(
            "ResourceClaim 'c': field 'spec.devices.requests[0].exactly.allocationMode'")):
        partitions_asked([("c", every)], driver=DRIVER)
