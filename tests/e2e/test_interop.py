"""gpufrag-scheduler with another project's device plugin on the nodes, end to end: the
extender configured for HAMi's or gpushare's resource names binds their typical pods and
writes, through the Binding, the annotations those device plugins read (docs/extender.md,
"Interop with HAMi and gpushare").

Each test starts its own extender (its ``names`` section set with ``--set names.*``) and its
own kube-scheduler profile, whose ``managedResources`` name the project's resources the way
that project's own scheduler-extender configuration does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes

from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess, gpufrag_scheduler_config
from devkit.stack import GROUP_LABEL, bound_node, delete_nodes
from gpufrag import conventions as cv

GPU_MEMORY_MIB = 23_028  # A10
GPUS = 4


@contextmanager
def _scheduler(plane: ControlPlane, log: Path, name: str, names: dict[str, str],
               managed: dict[str, bool]) -> Iterator[ExtenderProcess]:
    """An extender with these ``names`` and a kube-scheduler profile ``name`` calling it,
    whose managedResources add ``managed`` (resource -> ignoredByScheduler)."""
    sets = [a for k, v in {**names, "scheduler_name": name}.items()
            for a in ("--set", f"names.{k}={v}")]
    ext = ExtenderProcess(plane, log, extra_args=tuple(sets)).start()
    # managedResources is the last list of the configuration: extra entries append to it.
    config = gpufrag_scheduler_config(ext.url, name=name) + "".join(
        f"      - name: {r}\n        ignoredByScheduler: {str(i).lower()}\n"
        for r, i in managed.items())
    try:
        plane.start_scheduler(name, config)
        try:
            yield ext
        finally:
            plane.stop_scheduler(name)
    finally:
        ext.stop()


def _pod(name: str, scheduler: str, group: str, limits: dict[str, str]) -> dict[str, Any]:
    """A pod as these projects' users write it: the GPU resources as limits only (the API
    server copies limits of extended resources into requests)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "nodeSelector": {GROUP_LABEL: group},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "gpufrag-e2e:none",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                   "limits": limits}}]}}


def test_hami_pod_is_bound_with_hami_annotations(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    group, scheduler = "hami", "gpufrag-hami"
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    node = f"{group}-a10-0"
    uuids = [f"GPU-0000000{i}-e2e0-4a10-8000-00000000000{i}" for i in range(GPUS)]
    # What HAMi's device plugin registers (the JSON list of newer releases).
    register = json.dumps([{"id": u, "index": i, "count": 10, "devmem": GPU_MEMORY_MIB,
                            "devcore": 100, "type": "NVIDIA-NVIDIA A10", "numa": 0,
                            "mode": "hami-core", "health": True} for i, u in enumerate(uuids)])
    names = {"gpu_memory": "nvidia.com/gpumem", "gpu_cores": "nvidia.com/gpucores",
             "device_plugin": "hami"}
    # HAMi's own scheduler-extender configuration manages these, all but nvidia.com/gpu
    # ignored by kube-scheduler (no node advertises them).
    managed = {"nvidia.com/gpumem": True, "nvidia.com/gpucores": True}
    try:
        control_plane.create_gpu_node(node, GPUS, "A10", GPU_MEMORY_MIB, milli_resources=False,
                                      labels={GROUP_LABEL: group})
        core.patch_node(node, {"metadata": {"annotations": {
            "hami.io/node-nvidia-register": register}}})
        with _scheduler(control_plane, tmp_path / "extender.log", scheduler, names, managed):
            core.create_namespaced_pod(namespace, _pod("vgpu", scheduler, group, {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000",
                "nvidia.com/gpucores": "30"}))
            assert bound_node(core, namespace, "vgpu") == node
        pod = core.read_namespaced_pod("vgpu", namespace)
        annotations = pod.metadata.annotations or {}
        gpu = int(annotations[cv.ANNOTATION_GPU_INDICES])
        assert 0 <= gpu < GPUS
        devices = f"{uuids[gpu]},NVIDIA,4000,30:;"
        assert annotations["hami.io/vgpu-devices-to-allocate"] == devices
        assert annotations["hami.io/vgpu-devices-allocated"] == devices
        assert annotations["hami.io/vgpu-node"] == node
        assert annotations["hami.io/bind-phase"] == "allocating"
        assert annotations["hami.io/bind-time"] == annotations["hami.io/vgpu-time"]
        assert abs(int(annotations["hami.io/bind-time"])
                   - pod.metadata.creation_timestamp.timestamp()) < 120
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, [node])


def test_gpushare_pod_is_bound_with_gpushare_annotations(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    group, scheduler = "gpushare", "gpufrag-gpushare"
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    node = f"{group}-a10-0"
    names = {"gpu_memory": "aliyun.com/gpu-mem", "gpu_memory_unit": "GiB",
             "device_plugin": "gpushare"}
    # gpushare's device plugin advertises the node's GPU memory in GiB, and its
    # scheduler-extender configuration lets kube-scheduler count it node-wide.
    total_gib = GPUS * (GPU_MEMORY_MIB // 1024)
    managed = {"aliyun.com/gpu-mem": False}
    try:
        control_plane.create_gpu_node(node, GPUS, "A10", GPU_MEMORY_MIB, milli_resources=False,
                                      labels={GROUP_LABEL: group})
        extra = {"aliyun.com/gpu-mem": str(total_gib), "aliyun.com/gpu-count": str(GPUS)}
        core.patch_node_status(node, {"status": {"capacity": extra, "allocatable": extra}})
        with _scheduler(control_plane, tmp_path / "extender.log", scheduler, names, managed):
            core.create_namespaced_pod(namespace, _pod("share", scheduler, group, {
                "aliyun.com/gpu-mem": "4"}))
            assert bound_node(core, namespace, "share") == node
        pod = core.read_namespaced_pod("share", namespace)
        annotations = pod.metadata.annotations or {}
        gpu = annotations[cv.ANNOTATION_GPU_INDICES]
        assert 0 <= int(gpu) < GPUS
        assert annotations["ALIYUN_COM_GPU_MEM_IDX"] == gpu
        assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "4"
        assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == str(GPU_MEMORY_MIB // 1024)
        assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
        assume_s = int(annotations["ALIYUN_COM_GPU_MEM_ASSUME_TIME"]) / 1e9
        assert math.isclose(assume_s, pod.metadata.creation_timestamp.timestamp(), abs_tol=120)
    finally:
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        delete_nodes(control_plane, [node])
