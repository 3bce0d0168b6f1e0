"""HAMi- and gpushare-style pods: read with their resource names, placed as shares of one GPU
(GPU memory converted per node), bound with the annotations their device plugins read; GPU
resources the configuration does not map fail every node with a reason."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.conventions import KubeNames
from scheduler.core import ClusterState, PodRequest
from scheduler.kube.convert import (
    GPUSHARE_IDX,
    HAMI_BIND_PHASE,
    HAMI_NODE_REGISTER,
    HAMI_TO_ALLOCATE,
    UnsupportedRequest,
    pod_from_k8s,
)
from tests.builders import node
from tests.scheduler.extender.helpers import RecordingBinder, make_config, post, serve

HAMI = {"gpu_memory": "nvidia.com/gpumem", "gpu_cores": "nvidia.com/gpucores",
        "device_plugin": "hami"}
GPUSHARE = {"gpu_memory": "aliyun.com/gpu-mem", "gpu_memory_unit": "GiB",
            "device_plugin": "gpushare"}


def k8s(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"schedulerName": "gpufrag-scheduler",
                     "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Pending"}}


HAMI_POD = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}


def test_a_hami_pod_is_one_share_with_memory_and_cores() -> None:
    request = pod_from_k8s(k8s("h", HAMI_POD), KubeNames(**HAMI))
    assert (request.num_gpu, request.gpu_milli, request.gpu_memory_mib) == (1, 300, 4000)
    # 4000 MiB is 1/6 of a 24 GiB GPU (167 milli, less than the 30% of compute) and half of
    # an 8 GiB one (the memory decides).
    assert request.milli_on(24_576) == 300
    assert request.milli_on(8_000) == 500
    assert request.milli_on(2_000) is None


def test_gpushare_memory_is_in_gib() -> None:
    request = pod_from_k8s(k8s("g", {"aliyun.com/gpu-mem": "3"}), KubeNames(**GPUSHARE))
    assert (request.num_gpu, request.gpu_milli, request.gpu_memory_mib) == (1, 0, 3072)


@pytest.mark.parametrize("limits", [{"nvidia.com/mig-1g.5gb+me": "1"}, {"amd.com/gpu": "1"},
                                    {"nvidia.com/gpumem-percentage": "50"},
                                    {"nvidia.com/gpumem": "4000"}])
def test_unmapped_gpu_resources_are_refused_not_taken_for_cpu(limits: dict[str, str]) -> None:
    with pytest.raises(UnsupportedRequest, match="not configured for"):
        pod_from_k8s(k8s("m", limits))


def test_a_share_of_several_gpus_is_refused() -> None:
    with pytest.raises(UnsupportedRequest, match="one GPU only"):
        pod_from_k8s(k8s("m", {**HAMI_POD, "nvidia.com/gpu": "2"}), KubeNames(**HAMI))


def test_filter_fails_every_node_without_mig_unresolvable_for_a_mig_pod() -> None:
    runtime = serve([node("n0"), node("n1")])
    status, reply = post(runtime.app.test_client(), "/filter",
                         {"Pod": k8s("m", {"nvidia.com/mig-1g.5gb": "1"}),
                          "NodeNames": ["n0", "n1"]})
    assert status == 200 and reply["NodeNames"] == [] and not reply["FailedNodes"]
    assert set(reply["FailedAndUnresolvableNodes"]) == {"n0", "n1"}
    assert "not a MIG node" in reply["FailedAndUnresolvableNodes"]["n0"]


def test_memory_shares_convert_per_node_in_filter_and_state() -> None:
    nodes = [node("small", gpu_count=1, gpu_memory_mib=8_000),
             node("big", gpu_count=1, gpu_memory_mib=80_000),
             node("unlabelled", gpu_count=1)]
    state = ClusterState(nodes)
    share = PodRequest("s", num_gpu=1, gpu_memory_mib=6_000)
    state.place(share, "small", (0,))
    state.place(PodRequest("t", num_gpu=1, gpu_memory_mib=6_000), "big", (0,))
    assert state.gpu_free[0, 0] == 250 and state.gpu_free[1, 0] == 925
    runtime = serve(nodes, config=make_config(names=HAMI, filter={"answer": "feasible"}))
    _, reply = post(runtime.app.test_client(), "/filter",
                    {"Pod": k8s("h", {**HAMI_POD, "nvidia.com/gpumem": "12000"}),
                     "NodeNames": ["small", "big", "unlabelled"]})
    assert reply["NodeNames"] == ["big"]
    assert "8000 MiB" in reply["FailedAndUnresolvableNodes"]["small"]
    assert "unknown" in reply["FailedAndUnresolvableNodes"]["unlabelled"]


def test_hami_bind_writes_hami_annotations_with_the_gpu_uuid() -> None:
    n0 = node("n0", gpu_count=2, gpu_memory_mib=24_576)
    binder = RecordingBinder()
    runtime = serve([n0], [k8s("h", HAMI_POD)], config=make_config(names=HAMI), binder=binder)
    binder.nodes["n0"]["metadata"]["annotations"] = {
        HAMI_NODE_REGISTER: "GPU-aaa,10,24576,100,NVIDIA-T4,0,true:"
                            "GPU-bbb,10,24576,100,NVIDIA-T4,0,true:"}
    _, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "h", "PodNamespace": "default", "PodUID": "uid-h", "Node": "n0"})
    assert reply == {"Error": ""}
    (call,) = binder.calls
    uuid = ("GPU-aaa", "GPU-bbb")[call.gpus[0]]  # type: ignore[index]
    assert call.extra[HAMI_TO_ALLOCATE] == f"{uuid},NVIDIA,4000,30:;"
    assert call.extra[HAMI_BIND_PHASE] == "allocating"


def test_hami_bind_is_refused_without_the_node_uuids() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_memory_mib=24_576)], [k8s("h", HAMI_POD)],
                    config=make_config(names=HAMI), binder=binder)
    _, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "h", "PodNamespace": "default", "PodUID": "uid-h", "Node": "n0"})
    assert HAMI_NODE_REGISTER in reply["Error"] and not binder.calls
    assert runtime.cache.counts()["pods_assumed"] == 0


def test_gpushare_bind_writes_the_gpu_index_and_memory() -> None:
    binder = RecordingBinder()
    runtime = serve([node("n0", gpu_count=2, gpu_memory_mib=16_384)],
                    [k8s("g", {"aliyun.com/gpu-mem": "4"})],
                    config=make_config(names=GPUSHARE), binder=binder)
    _, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "g", "PodNamespace": "default", "PodUID": "uid-g", "Node": "n0"})
    assert reply == {"Error": ""}
    (call,) = binder.calls
    assert call.extra[GPUSHARE_IDX] == str(call.gpus[0])  # type: ignore[index]
    assert call.extra["ALIYUN_COM_GPU_MEM_POD"] == "4"
    assert call.extra["ALIYUN_COM_GPU_MEM_DEV"] == "16"
    assert call.extra["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"


def test_filter_fails_every_node_for_a_memory_ask_with_no_carrier() -> None:
    runtime = serve([node("n0", gpu_memory_mib=81_920), node("n1", gpu_memory_mib=81_920)])
    client = runtime.app.test_client()
    status, reply = post(client, "/filter", {
        "Pod": k8s("alone", {"gpufrag.io/gpu-memory-mib": "6000"}), "NodeNames": ["n0", "n1"]})
    assert status == 200 and reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == {"n0", "n1"}
    assert "no device plugin hands a GPU for memory alone" in \
        reply["FailedAndUnresolvableNodes"]["n0"]
    status, reply = post(client, "/filter", {
        "Pod": k8s("carried", {"gpufrag.io/gpu-memory-mib": "6000", "gpufrag.io/gpu-milli": "1"}),
        "NodeNames": ["n0", "n1"]})
    assert status == 200 and reply["NodeNames"], reply
