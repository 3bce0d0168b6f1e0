"""HAMi pods with several containers, each asking ``nvidia.com/gpu`` + ``nvidia.com/gpumem`` +
``nvidia.com/gpucores``: read as one share of one GPU (the containers' sum), and annotated per
container the way HAMi's scheduler encodes them and its device plugin decodes them.

HAMi's rules, from its sources (``pkg/device/devices.go``): ``Resourcereqs`` takes one request
per app container (``pod.Spec.Containers``, init containers not counted);
``EncodePodSingleDevice`` writes one ``;``-terminated segment per container, each device in it
``UUID,Type,usedmem,usedcores:``; ``DecodePodDevices`` splits on ``;``, skips empty segments and
hands the rest to the containers that ask, in order. :func:`hami_decode` below is that reading.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.conventions import KubeNames
from gpufrag.errors import BadInput
from scheduler.kube.convert import (
    HAMI_ALLOCATED,
    HAMI_NODE_REGISTER,
    HAMI_TO_ALLOCATE,
    UnsupportedRequest,
    container_gpus,
    device_plugin_annotations,
    pod_from_k8s,
    pod_to_k8s,
)
from tests.builders import node
from tests.scheduler.extender.helpers import RecordingBinder, make_config, post, serve

HAMI = KubeNames(gpu_memory="nvidia.com/gpumem", gpu_cores="nvidia.com/gpucores",
                 device_plugin="hami")
GPU_MIB = 24_576
UUIDS = ("GPU-aaa", "GPU-bbb", "GPU-ccc", "GPU-ddd")
REGISTERED = {"metadata": {"annotations": {HAMI_NODE_REGISTER: "".join(
    f"{u},10,{GPU_MIB},100,NVIDIA-T4,0,true:" for u in UUIDS)}}}


def hami(mem: int | None = None, cores: int | None = None, gpus: int = 1) -> dict[str, str]:
    limits = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return limits


def pod(*containers: dict[str, str] | None, init: dict[str, str] | None = None
        ) -> dict[str, Any]:
    """A pod whose containers ask ``containers`` (None: a container without GPUs)."""
    spec: dict[str, Any] = {"schedulerName": "gpufrag-scheduler", "containers": [
        {"name": f"c{i}", "resources": {"limits": limits} if limits else {}}
        for i, limits in enumerate(containers)]}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": init}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "h", "namespace": "default", "uid": "uid-h"},
            "spec": spec, "status": {"phase": "Pending"}}


def annotate(obj: dict[str, Any], gpus: tuple[int, ...]) -> str:
    request = pod_from_k8s(obj, HAMI)
    extra = device_plugin_annotations(HAMI, request, gpus, node="n0", gpu_memory_mib=GPU_MIB,
                                      node_obj=REGISTERED, now_ns=1, pod_obj=obj)
    assert extra[HAMI_ALLOCATED] == extra[HAMI_TO_ALLOCATE]
    return extra[HAMI_TO_ALLOCATE]


def hami_decode(value: str) -> list[list[tuple[str, int, int]]]:
    """What HAMi's device plugin hands the asking containers, in order."""
    containers = []
    for segment in value.split(";"):
        devices = [(d.split(",")[0], int(d.split(",")[2]), int(d.split(",")[3]))
                   for d in segment.split(":") if "," in d]
        if devices:
            containers.append(devices)
    return containers


def test_each_container_gets_its_own_memory_and_cores_on_the_pods_one_gpu() -> None:
    obj = pod(hami(3000, 30), None, hami(2000, 20))
    request = pod_from_k8s(obj, HAMI)
    # One share of one GPU: the containers' sum, as kube-scheduler sums their requests.
    assert (request.num_gpu, request.gpu_milli, request.gpu_memory_mib) == (1, 500, 5000)
    value = annotate(obj, (1,))
    # One segment per app container; the sidecar's is empty.
    assert value == "GPU-bbb,NVIDIA,3000,30:;;GPU-bbb,NVIDIA,2000,20:;"
    assert hami_decode(value) == [[("GPU-bbb", 3000, 30)], [("GPU-bbb", 2000, 20)]]


def test_containers_with_memory_only_or_cores_only() -> None:
    obj = pod(hami(4000), hami(cores=25))
    request = pod_from_k8s(obj, HAMI)
    assert (request.gpu_milli, request.gpu_memory_mib) == (250, 4000)
    # Cores alone: its memory is its compute share of the GPU (25% of 24,576 MiB), the same
    # conversion the extender placed it with; memory alone sets no compute limit (0).
    assert annotate(obj, (0,)) == "GPU-aaa,NVIDIA,4000,0:;GPU-aaa,NVIDIA,6144,25:;"


def test_a_whole_gpu_pod_gives_each_container_its_own_gpus() -> None:
    obj = pod({"nvidia.com/gpu": "1"}, None, {"nvidia.com/gpu": "2"})
    assert pod_from_k8s(obj, HAMI).num_gpu == 3
    value = annotate(obj, (0, 2, 3))
    assert hami_decode(value) == [[("GPU-aaa", GPU_MIB, 100)],
                                  [("GPU-ccc", GPU_MIB, 100), ("GPU-ddd", GPU_MIB, 100)]]
    assert value.count(";") == 3


def test_one_container_and_init_containers_keep_the_single_segment() -> None:
    assert annotate(pod(hami(4000, 30)), (2,)) == "GPU-ccc,NVIDIA,4000,30:;"
    # Init containers are not HAMi's containers: the app container's segment only. The pod's
    # share is the larger of the two, as Kubernetes computes an effective request.
    obj = pod(hami(2000, 10), init=hami(6000, 50))
    assert pod_from_k8s(obj, HAMI).gpu_memory_mib == 6000
    assert annotate(obj, (0,)) == "GPU-aaa,NVIDIA,2000,10:;"


def test_without_the_pod_object_the_pods_share_goes_to_one_container() -> None:
    obj = pod(hami(3000, 30), hami(2000, 20))
    request = pod_from_k8s(obj, HAMI)
    extra = device_plugin_annotations(HAMI, request, (0,), node="n0", gpu_memory_mib=GPU_MIB,
                                      node_obj=REGISTERED, now_ns=1)
    assert extra[HAMI_TO_ALLOCATE] == "GPU-aaa,NVIDIA,5000,50:;"


@pytest.mark.parametrize(("containers", "message"), [
    ((hami(3000, 30, gpus=2),), "container 'c0' asks for 2 GPUs with a share of each"),
    ((hami(3000, 30), hami(2000, 20, gpus=3)), "container 'c1' asks for 3 GPUs"),
    (({"nvidia.com/gpu": "1"}, hami(2000, 20)),
     "containers c0 ask for whole GPUs (nvidia.com/gpu without a share) and c1 for shares"),
])
def test_what_cannot_be_one_share_is_refused_with_the_container_named(
        containers: tuple[dict[str, str], ...], message: str) -> None:
    with pytest.raises(UnsupportedRequest, match="one GPU") as refused:
        pod_from_k8s(pod(*containers), HAMI)
    assert message in str(refused.value)


def test_more_than_a_gpus_compute_in_sum_is_bad_input() -> None:
    with pytest.raises(BadInput, match="110% of a GPU's compute: at most 100"):
        pod_from_k8s(pod(hami(1000, 60), hami(1000, 50)), HAMI)


def test_container_gpus_reads_every_container_in_order() -> None:
    found = container_gpus(pod(hami(3000, 30), None, {"nvidia.com/gpumem": "2"}),
                           KubeNames(gpu_memory="nvidia.com/gpumem", gpu_memory_unit="GiB"))
    assert [(c.name, c.count, c.memory_mib, c.asks_gpu) for c in found] == [
        ("c0", 1, 3000 * 1024, True), ("c1", 0, 0, False), ("c2", 0, 2048, True)]


@pytest.mark.parametrize(("quantity", "mib"), [("8Gi", 8192), ("1.5Gi", 1536), ("1M", 1),
                                               ("8589934592", 8192)])
def test_koordinator_gpu_memory_is_a_byte_count(quantity: str, mib: int) -> None:
    names = KubeNames(gpu_memory="koordinator.sh/gpu-memory", gpu_memory_unit="bytes")
    obj = pod({"nvidia.com/gpu": "1", "koordinator.sh/gpu-memory": quantity})
    assert pod_from_k8s(obj, names).gpu_memory_mib == mib
    written = pod_to_k8s(pod_from_k8s(obj, names), names)
    requests = written["spec"]["containers"][0]["resources"]["requests"]
    assert requests["koordinator.sh/gpu-memory"] == f"{mib}Mi"  # and read back the same
    assert pod_from_k8s(written, names).gpu_memory_mib == mib


def test_the_extender_binds_a_multi_container_hami_pod_per_container() -> None:
    binder = RecordingBinder()
    obj = pod(hami(3000, 30), None, hami(2000, 20))
    runtime = serve([node("n0", gpu_count=4, gpu_memory_mib=GPU_MIB)], [obj],
                    config=make_config(names={"gpu_memory": "nvidia.com/gpumem",
                                              "gpu_cores": "nvidia.com/gpucores",
                                              "device_plugin": "hami"}), binder=binder)
    binder.nodes["n0"]["metadata"]["annotations"] = dict(
        REGISTERED["metadata"]["annotations"])
    _, reply = post(runtime.app.test_client(), "/bind", {
        "PodName": "h", "PodNamespace": "default", "PodUID": "uid-h", "Node": "n0"})
    assert reply == {"Error": ""}
    (call,) = binder.calls
    assert call.gpus is not None and len(call.gpus) == 1
    uuid = UUIDS[call.gpus[0]]
    assert hami_decode(call.extra[HAMI_TO_ALLOCATE]) == [[(uuid, 3000, 30)], [(uuid, 2000, 20)]]
