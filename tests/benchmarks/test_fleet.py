"""The fleet-scale harness's pure parts (devkit.fleet): how the fleet and its pods are drawn,
how a pod is written, and the histogram quantile the benchmark reads kube-scheduler with."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from devkit.fleet import RESIDENT_NAMESPACE, make_fleet, pod_body, quantile, resident_body
from gpufrag import conventions as cv
from scheduler.core import ClusterState
from scheduler.core.types import PodRequest
from tests.data import trace


def test_without_the_trace_the_fleet_is_synthetic_and_stops_at_the_demand_cap(
        tmp_path: Path) -> None:
    fleet = make_fleet(30, 5000, seed=3, data_dir=tmp_path, max_demand=0.5)
    assert fleet.source == "synthetic" and len(fleet.nodes) == 30
    assert [n.name for n in fleet.nodes[:2]] == ["fleet-00000", "fleet-00001"]
    assert all(n.gpu_count and n.gpu_memory_mib for n in fleet.nodes)
    assert fleet.asked_pods == 5000 and 0 < len(fleet.pods) < 5000
    assert fleet.demand_milli <= fleet.capacity_milli * 0.5
    products = {n.gpu_product for n in fleet.nodes}
    assert all(p.gpu_spec <= products for p in fleet.pods)
    assert make_fleet(30, 5000, seed=3, data_dir=tmp_path, max_demand=0.5) == fleet  # seeded


def test_with_the_trace_the_fleet_is_the_openb_mix() -> None:
    fleet = make_fleet(1000, 2000, seed=0, data_dir=trace("openb"))  # multi-GPU pods are ~1%
    assert fleet.source == "openb" and len(fleet.pods) == 2000
    assert {n.gpu_product for n in fleet.nodes} >= {"G2", "T4"}
    assert {n.gpu_count for n in fleet.nodes} <= {1, 2, 4, 8}
    assert any(p.is_share for p in fleet.pods) and any(p.num_gpu > 1 for p in fleet.pods)


def test_residents_are_bound_gpu_pods_of_the_same_draw_then_system_pods(
        tmp_path: Path) -> None:
    """The measured pods are the draw's last ``pods``; the GPU residents the ones before,
    each on a node that holds it with every resident before it (a GPU never over-committed);
    system pods (no GPU) fill up the residents' count, spread over the nodes."""
    alone = make_fleet(30, 20, seed=3, data_dir=tmp_path, max_demand=0.8)
    fleet = make_fleet(30, 20, seed=3, data_dir=tmp_path, max_demand=0.8, residents=400)
    assert len(fleet.pods) == 20 and len(fleet.residents) == 400
    gpu = [r for r in fleet.residents if r.gpus is not None]  # the trace's (a few CPU-only)
    system = [r for r in fleet.residents if r.gpus is None]
    assert system and sum(r.pod.wants_gpu for r in gpu) > 0.8 * len(gpu)
    assert not any(r.pod.wants_gpu for r in system)
    assert {r.node for r in system} == {n.name for n in fleet.nodes}  # spread over all
    assert fleet.demand_milli + sum(r.pod.gpu_demand_milli for r in gpu) \
        <= fleet.capacity_milli * 0.8
    assert [p.name for p in fleet.pods] != [p.name for p in alone.pods]  # the draw's tail
    state = ClusterState(fleet.nodes)
    for r in gpu:  # raises PlacementError on an over-committed GPU
        state.place(r.pod, state.index[r.node], r.gpus or ())
    gpu = [r for r in gpu if r.pod.wants_gpu]
    body = resident_body(gpu[0])
    assert body["spec"]["nodeName"] == gpu[0].node
    assert body["metadata"]["namespace"] == RESIDENT_NAMESPACE
    assert body["metadata"]["annotations"][cv.ANNOTATION_GPU_INDICES] == ",".join(
        map(str, gpu[0].gpus or ()))


@pytest.mark.parametrize("bad", [{"nodes": 0}, {"pods": 0}, {"max_demand": 0.0},
                                 {"max_demand": 1.5}, {"residents": -1}])
def test_a_bad_size_is_refused(bad: dict[str, float], tmp_path: Path) -> None:
    args = {"nodes": 5, "pods": 5, "max_demand": 0.5, "residents": 0} | bad
    with pytest.raises(ValueError, match="must be|>= 0"):
        make_fleet(int(args["nodes"]), int(args["pods"]), data_dir=tmp_path,
                   max_demand=args["max_demand"], residents=int(args["residents"]))


def test_pods_ask_for_gpufrags_resources() -> None:
    share = pod_body(PodRequest("s", cpu_milli=4000, memory_mib=2048, num_gpu=1, gpu_milli=470,
                                gpu_spec=frozenset({"T4"})), "sched")
    whole = pod_body(PodRequest("w", cpu_milli=8000, memory_mib=1024, num_gpu=2,
                                gpu_milli=1000), "sched")
    requests = [b["spec"]["containers"][0]["resources"]["requests"] for b in (share, whole)]
    assert requests[0] == {"cpu": "4000m", "memory": "2048Mi", cv.RESOURCE_GPU_MILLI: "470"}
    assert requests[1] == {"cpu": "8000m", "memory": "1024Mi", cv.RESOURCE_GPU: "2"}
    assert share["metadata"]["annotations"] == {cv.ANNOTATION_GPU_SPEC: "T4"}
    assert share["spec"]["schedulerName"] == whole["spec"]["schedulerName"] == "sched"


def test_quantile_interpolates_inside_the_bucket() -> None:
    buckets = [(0.001, 50.0), (0.01, 90.0), (0.1, 100.0), (math.inf, 100.0)]
    assert quantile(buckets, 0.5) == pytest.approx(0.001)
    assert quantile(buckets, 0.7) == pytest.approx(0.001 + 0.009 * 0.5)
    assert quantile(buckets, 0.99) == pytest.approx(0.01 + 0.09 * 0.9)
    assert math.isnan(quantile([], 0.5)) and math.isnan(quantile([(1.0, 0.0)], 0.5))
    assert quantile([(1.0, 5.0), (math.inf, 10.0)], 0.99) == 1.0  # past the last bound
