"""Converters from Kubernetes JSON to core types."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.convert import (
    UnsupportedRequest,
    bound_gpus,
    container_mig_asks,
    controller_ref,
    device_gap,
    gpu_labels,
    mig_offers,
    mig_request,
    node_from_k8s,
    owner_uid,
    pod_from_k8s,
    uncarried,
)


def k8s_pod(requests: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", **meta},
            "spec": {"containers": [{"name": "c", "resources": {"requests": requests or {}}}]}}


def test_node() -> None:
    node = node_from_k8s({
        "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "V100M32",
                                                  "nvidia.com/gpu.memory": "32768"}},
        "status": {"allocatable": {"cpu": "95500m", "memory": "384Gi", "nvidia.com/gpu": "8"}},
    })
    assert (node.name, node.cpu_milli, node.memory_mib, node.gpu_count, node.gpu_product,
            node.gpu_memory_mib) == ("gpu-1", 95_500, 393_216, 8, "V100M32", 32_768)


def test_pod_whole_share_and_effective_requests() -> None:
    whole = pod_from_k8s(k8s_pod({"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "2"}))
    assert (whole.cpu_milli, whole.memory_mib, whole.num_gpu, whole.gpu_milli) == (2000, 4096, 2,
                                                                                     1000)
    share = pod_from_k8s(k8s_pod({"gpufrag.io/gpu-milli": "470"},
                                 labels={"gpufrag.io/model": "m", "gpufrag.io/model-version": "3"},
                                 annotations={"gpufrag.io/gpu-spec": "T4|V100M16"}))
    assert (share.num_gpu, share.gpu_milli, share.model, share.model_version, share.gpu_spec) == (
        1, 470, "m", "3", frozenset({"T4", "V100M16"}))
    obj = k8s_pod({"cpu": "500m"})
    obj["spec"]["containers"].append({"name": "b", "resources": {"limits": {"cpu": "1"}}})
    obj["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "3"}}}]
    obj["spec"]["overhead"] = {"cpu": "100m"}
    assert pod_from_k8s(obj).cpu_milli == 3100  # max(0.5 + 1, 3) + 0.1


@pytest.mark.parametrize(
    ("requests", "message"),
    [({"cpu": "lots"}, "spec.containers\\[0\\].resources.requests.cpu"),
     ({"cpu": "-1"}, "is negative"),
     ({"nvidia.com/gpu": "1.5"}, "not a whole number"),
     ({"nvidia.com/gpu": "1", "gpufrag.io/gpu-milli": "300"}, "use one"),
     ({"gpufrag.io/gpu-milli": "1500"}, "shares must be below 1000"),
     ({"nvidia.com/gpu": "40"}, "more than any node has")],
)
def test_bad_pods(requests: dict[str, str], message: str) -> None:
    with pytest.raises(BadInput, match=message):
        pod_from_k8s(k8s_pod(requests))


def test_pod_without_name_and_bad_shapes() -> None:
    with pytest.raises(BadInput, match="metadata.name"):
        pod_from_k8s({"metadata": {}})
    with pytest.raises(BadInput, match="expected a list"):
        pod_from_k8s({"metadata": {"name": "x"}, "spec": {"containers": {}}})


def test_bound_gpus_and_owner() -> None:
    assert bound_gpus(k8s_pod(annotations={"gpufrag.io/gpu-indices": "0,3"})) == (0, 3)
    assert bound_gpus(k8s_pod(annotations={"gpufrag.io/gpu-indices": "x"})) is None
    assert bound_gpus(k8s_pod()) is None
    obj = k8s_pod(ownerReferences=[
        {"kind": "Node", "uid": "n", "name": "n0"},  # an owner, not the controller
        {"kind": "ReplicaSet", "uid": "u1", "name": "web-7d", "controller": True}])
    assert owner_uid(obj) == "u1" and owner_uid(k8s_pod()) == ""
    assert controller_ref(obj) == ("ReplicaSet", "u1", "web-7d")
    assert controller_ref(k8s_pod()) == ("", "", "")
    with pytest.raises(BadInput, match="ownerReferences"):
        controller_ref(k8s_pod(ownerReferences={"kind": "ReplicaSet"}))


def test_a_memory_share_may_ride_on_milli_and_counts_at_least_its_memory() -> None:
    carried = pod_from_k8s(k8s_pod({"gpufrag.io/gpu-milli": "1",
                                    "gpufrag.io/gpu-memory-mib": "6000"}))
    assert (carried.num_gpu, carried.gpu_milli, carried.gpu_memory_mib) == (1, 1, 6000)
    assert carried.milli_on(81_920) == 74  # 6,000 of 81,920 MiB, rounded up
    compute = pod_from_k8s(k8s_pod({"gpufrag.io/gpu-milli": "500",
                                    "gpufrag.io/gpu-memory-mib": "6000"}))
    assert compute.milli_on(81_920) == 500  # the larger of its compute and its memory
    with pytest.raises(BadInput, match="must be below 1000"):
        pod_from_k8s(k8s_pod({"gpufrag.io/gpu-milli": "1000", "gpufrag.io/gpu-memory-mib": "1"}))


@pytest.mark.parametrize(("requests", "gap"), [
    ({"gpufrag.io/gpu-memory-mib": "6000"}, True),  # alone: no device plugin hands it a GPU
    ({"gpufrag.io/gpu-memory-mib": "6000", "gpufrag.io/gpu-milli": "1"}, False),
    ({"gpufrag.io/gpu-memory-mib": "6000", "nvidia.com/gpu": "1"}, False),  # HAMi's way
    ({"gpufrag.io/gpu-milli": "300"}, False),
    ({"cpu": "1"}, False),
])
def test_a_memory_ask_alone_is_named_as_starting_without_its_gpu(
        requests: dict[str, str], gap: bool) -> None:
    obj = k8s_pod(requests)
    assert bool(uncarried(obj)) is gap
    message = device_gap(obj)
    assert (message is not None) is gap
    if message is not None:
        assert "container 'c'" in message and "gpufrag.io/gpu-milli: 1" in message


def test_other_vendors_memory_resources_bring_their_own_device_plugin() -> None:
    gpushare = KubeNames(gpu_memory="aliyun.com/gpu-mem", gpu_memory_unit="GiB")
    assert device_gap(k8s_pod({"aliyun.com/gpu-mem": "4"}), gpushare) is None


# ------------------------------------------------------------------ MIG (issue 28)

def test_a_mig_pod_reads_as_its_cpu_and_its_profiles_summed_over_containers() -> None:
    obj = k8s_pod({"cpu": "1", "nvidia.com/mig-1g.10gb": "1"})
    obj["spec"]["containers"].append({"name": "b", "resources": {
        "limits": {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}}})
    obj["spec"]["initContainers"] = [{"name": "i", "resources": {
        "requests": {"nvidia.com/mig-1g.10gb": "3"}}}]
    request = pod_from_k8s(obj)
    assert (request.cpu_milli, request.num_gpu, request.wants_gpu) == (1000, 0, False)
    # containers: 1 + 1 of 1g.10gb (the init container's 3 is more) and one 3g.40gb
    assert mig_request(obj) == {"1g.10gb": 3, "3g.40gb": 1}
    assert mig_request(k8s_pod({"cpu": "1", "nvidia.com/gpu": "1"})) == {}


def test_each_containers_mig_asks_are_read_by_name_table_profile_or_not() -> None:
    obj = k8s_pod({"cpu": "1", "nvidia.com/mig-1g.10gb": "2"})
    obj["spec"]["containers"].append({"name": "b", "resources": {
        "limits": {"nvidia.com/mig-1g.10gb+me": "1", "nvidia.com/gpu": "1"}}})
    obj["spec"]["containers"].append({"name": "c"})
    obj["spec"]["initContainers"] = [{"name": "i", "resources": {
        "requests": {"nvidia.com/mig-3g.40gb": "1"}}}]
    assert container_mig_asks(obj) == (
        {"nvidia.com/mig-1g.10gb": 2}, {"nvidia.com/mig-1g.10gb+me": 1}, {})
    assert container_mig_asks(obj, "initContainers") == ({"nvidia.com/mig-3g.40gb": 1},)
    assert container_mig_asks(k8s_pod({"cpu": "1"})) == ({},)
    with pytest.raises(BadInput) as e:
        container_mig_asks(k8s_pod({"nvidia.com/mig-1g.10gb": "some"}))
    assert e.value.field == "spec.containers[0].resources.requests.nvidia.com/mig-1g.10gb"


def test_a_node_offers_each_mig_profile_it_advertises_a_whole_count_of() -> None:
    node = {"metadata": {"name": "n"}, "status": {"allocatable": {
        "nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "0",
        "nvidia.com/mig-2g.20gb": "500m", "nvidia.com/mig-1g.10gb+me": "1",
        "nvidia.com/mig-4g.40gb": "lots", "nvidia.com/gpu": "2"}}}
    assert mig_offers(node) == {"1g.10gb": 7}
    assert mig_offers({"metadata": {"name": "n"}}) == {}


def test_gpu_labels_read_as_zero_where_absent_or_not_a_number() -> None:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
              "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "eight"}
    gpu = gpu_labels(labels)
    assert (gpu.product, gpu.memory_mib, gpu.count) == ("NVIDIA-A100-SXM4-80GB", 81920, 0)
    assert gpu_labels({}) == gpu_labels({"nvidia.com/gpu.memory": "-1"})


def test_a_mig_count_that_is_not_whole_is_bad_input_naming_the_resource() -> None:
    with pytest.raises(BadInput, match="whole number of MIG instances") as e:
        mig_request(k8s_pod({"nvidia.com/mig-1g.10gb": "500m"}))
    assert e.value.field == "requests.nvidia.com/mig-1g.10gb"


@pytest.mark.parametrize("requests", [
    {"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"},
    {"nvidia.com/mig-3g.40gb": "1", "gpufrag.io/gpu-milli": "300"},
])
def test_a_pod_mixing_a_mig_profile_with_gpus_or_shares_is_refused(requests: dict[str, str]
                                                                   ) -> None:
    with pytest.raises(UnsupportedRequest, match="either MIG instances or whole GPUs"):
        pod_from_k8s(k8s_pod(requests))


@pytest.mark.parametrize("resource", ["nvidia.com/mig-1g.10gb+me", "nvidia.com/mig-big",
                                      "amd.com/gpu"])
def test_other_gpu_like_resources_are_still_refused(resource: str) -> None:
    with pytest.raises(UnsupportedRequest, match="not configured for"):
        pod_from_k8s(k8s_pod({resource: "1"}))


def _mig_node(strategy: str, whole: str | None) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/mig-3g.40gb": "4"}
    if whole is not None:
        alloc["nvidia.com/gpu"] = whole
    return {"metadata": {"name": "mig-1", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "4", "nvidia.com/mig.strategy": strategy}},
        "status": {"allocatable": alloc}}


def test_mig_gpus_never_count_as_whole_free_gpus() -> None:
    # mixed: nvidia.com/gpu lists only the GPUs not in MIG mode (here 2 of 4, or none)
    assert node_from_k8s(_mig_node("mixed", "2")).gpu_count == 2
    assert node_from_k8s(_mig_node("mixed", None)).gpu_count == 0
    # single: nvidia.com/gpu counts MIG instances; none of them is a whole GPU
    assert node_from_k8s(_mig_node("single", "8")).gpu_count == 0
