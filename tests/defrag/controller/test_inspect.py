"""``gpufrag inspect`` on a snapshot file: each GPU's holders, use, idle memory and trigger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from defrag.controller.inspect import main as inspect_main
from defrag.controller.inspect import table, view
from defrag.controller.snapshot import UsageSource, build_snapshot
from gpufrag import conventions as cv
from gpufrag.gpu_usage import (
    GpuUsage,
    MigInstanceUsage,
    NodeGpuUsage,
    PodGpuUsage,
    StrayProcess,
)
from node.dra.slices import build_slices
from node.gpus import Gpu
from scheduler.kube.claims import DRIVER_NAME, mig_device_name
from scheduler.kube.snapshot import write_snapshot
from tests.defrag.controller.builders import k8s_node, k8s_pod

NOW = 1_767_225_600.0


def _usage(node: str, gpus: list[tuple[int, int, list[tuple[str, str, int]]]],
           strays: dict[int, tuple[StrayProcess, ...]] | None = None,
           timestamp: float = NOW) -> dict[str, str]:
    reading = NodeGpuUsage(node=node, timestamp=timestamp, interval_s=15.0, gpus=tuple(
        GpuUsage(index=i, uuid=f"GPU-{node}-{i}", product="Tesla-T4", memory_used_mib=used,
                 memory_total_mib=16_384, utilization_pct=10,
                 pods=tuple(PodGpuUsage(ns, name, f"uid-{name}", mib) for ns, name, mib in pods),
                 strays=(strays or {}).get(i, ()))
        for i, used, pods in gpus))
    return {cv.ANNOTATION_GPU_USAGE: reading.to_json()}


def _written(path: Path, nodes: list[dict[str, object]], pods: list[dict[str, object]]) -> Path:
    write_snapshot(path, nodes, pods)
    return path


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """n0: GPU 0 held by two shares (web 500 milli using 1,000 MiB, api 300 using 4,000), GPU 1
    by a whole-GPU pod of another namespace; n1: no reading; one GPU pod pending."""
    nodes = [k8s_node("n0", annotations=_usage("n0", [
                 (0, 5000, [("ns", "web", 1000), ("ns", "api", 4000)]),
                 (1, 16_000, [("other", "big", 16_000)])])),
             k8s_node("n1", unschedulable=True)]
    pods = [k8s_pod("web", node="n0", milli=500, indices="0"),
            k8s_pod("api", node="n0", milli=300, indices="0"),
            k8s_pod("big", namespace="other", node="n0", gpus=1, indices="1"),
            k8s_pod("waiting", milli=200, scheduler_name=cv.SCHEDULER_NAME)]
    return _written(tmp_path / "cluster.json", nodes, pods)


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert inspect_main([*args, "-o", "json"]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_each_gpu_shows_its_holders_use_and_the_nodes_idle_memory(
        snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--snapshot", str(snapshot))
    n0, n1 = data["nodes"]  # type: ignore[misc]
    gpu0, gpu1 = n0["gpus"]
    assert (gpu0["free_milli"], gpu0["used_mib"]) == (200, 5000)
    assert [(h["pod"], h["milli"], h["asked"], h["used_mib"]) for h in gpu0["holders"]] == [
        ("ns/api", 300, "milli", 4000), ("ns/web", 500, "milli", 1000)]
    assert [(h["pod"], h["asked"]) for h in gpu1["holders"]] == [("other/big", "whole")]
    # idle = reserved - peak: 800 milli of 16,384 MiB reserved on GPU 0 (13,107 MiB), 5,000
    # used; GPU 1 16,384 reserved, 16,000 used
    reserved = 16_384 * 800 / 1000 + 16_384
    idle = (16_384 * 800 / 1000 - 5000) + (16_384 - 16_000)
    assert n0["idle_ratio"] == round(idle / reserved, 4) and n0["trigger"] == "over"
    assert (n1["trigger"], n1["idle_ratio"], n1["cordoned"]) == ("no reading", None, True)
    assert data["pending_gpu_pods"] == ["ns/waiting"]


def test_filters_keep_one_node_or_one_namespaces_holders(
        snapshot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--snapshot", str(snapshot), "--namespace", "other")
    (only,) = data["nodes"]  # type: ignore[misc]
    holders = [h["pod"] for g in only["gpus"] for h in g["holders"]]
    assert only["node"] == "n0" and holders == ["other/big"]
    data = _json(capsys, "--snapshot", str(snapshot), "--node", "n1")
    assert [n["node"] for n in data["nodes"]] == ["n1"]  # type: ignore[attr-defined]


def test_the_table_and_yaml_say_the_same(snapshot: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(["--snapshot", str(snapshot), "-o", "wide"]) == 0
    out = capsys.readouterr()
    assert "ns/web: 500 milli, asked milli, used 1,000 MiB" in out.out
    assert "gpu 0: free 200 milli, used 5,000 MiB" in out.out
    assert "2 node(s);" in out.out and "1 GPU pod(s) pending" in out.out
    assert inspect_main(["--snapshot", str(snapshot), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["nodes"][0]["node"] == "n0"


@pytest.mark.parametrize(("args", "message"), [
    (["--node", "nowhere"], "no node 'nowhere' in the cluster (2 nodes read)"),
    (["--threshold", "1.5"], "--threshold"),
])
def test_bad_input_is_one_line_and_exit_2(snapshot: Path, capsys: pytest.CaptureFixture[str],
                                          args: list[str], message: str) -> None:
    assert inspect_main(["--snapshot", str(snapshot), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_missing_snapshot_file_is_exit_2(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(["--snapshot", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.fixture
def with_strays(tmp_path: Path) -> Path:
    """n0's GPU 1 holds two processes of no live pod beside its pod (one whose pod was deleted,
    one in no pod); n1's reading names one too but is stale, so it is not believed."""
    nodes = [k8s_node("n0", annotations=_usage("n0", [
                 (0, 1000, [("ns", "web", 1000)]),
                 (1, 14_000, [("ns", "big", 10_000)])],
                 strays={1: (StrayProcess(4242, 3_000, "pod_gone"),
                             StrayProcess(7070, 1_000, "no_pod"))})),
             k8s_node("n1", annotations=_usage("n1", [(0, 2000, [])],
                                               strays={0: (StrayProcess(99, 2000, "no_pod"),)},
                                               timestamp=NOW - 3600))]
    pods = [k8s_pod("web", node="n0", milli=500, indices="0"),
            k8s_pod("big", node="n0", gpus=1, indices="1")]
    return _written(tmp_path / "strays.json", nodes, pods)


def test_a_process_of_no_live_pod_shows_under_its_gpu_and_at_the_end(
        with_strays: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--snapshot", str(with_strays))
    n0, n1 = data["nodes"]  # type: ignore[misc]
    assert n0["gpus"][0]["strays"] == []
    assert n0["gpus"][1]["strays"] == [{"pid": 4242, "used_mib": 3000, "reason": "pod_gone"},
                                       {"pid": 7070, "used_mib": 1000, "reason": "no_pod"}]
    assert [g["strays"] for g in n1["gpus"]] == [[], []]  # a stale reading is not believed
    assert [(s["node"], s["gpu"], s["pid"], s["reason"]) for s in data["strays"]] == [
        ("n0", 1, 4242, "pod_gone"), ("n0", 1, 7070, "no_pod")]
    assert data["strays"][0]["detail"] == (  # type: ignore[index]
        "process 4242 holds 3000 MiB on GPU 1 (GPU-n0-1) and its pod is gone from this node: "
        "the memory stays taken until it exits")
    assert _json(capsys, "--snapshot", str(with_strays), "--node", "n1")["strays"] == []


def test_the_table_marks_each_stray_and_lists_it(
        with_strays: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect_main(["--snapshot", str(with_strays)]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpu1 = lines.index(next(line for line in lines if line.startswith("  gpu 1:")))
    assert lines[gpu1 + 1].startswith("    ns/big: 1000 milli, asked whole")
    assert lines[gpu1 + 2:gpu1 + 4] == [
        "    process 4242 (no live pod): 3,000 MiB, STRAY (pod_gone)",
        "    process 7070 (no live pod): 1,000 MiB, STRAY (no_pod)"]
    assert "stray process 7070 on n0 (no_pod): process 7070 holds 1000 MiB on GPU 1 " \
           "(GPU-n0-1) and it runs in no pod: the memory stays taken until it exits" in lines
    assert inspect_main(["--snapshot", str(with_strays), "-o", "yaml"]) == 0
    assert [s["pid"] for s in yaml.safe_load(capsys.readouterr().out)["strays"]] == [4242, 7070]


@pytest.fixture
def misallocated(tmp_path: Path) -> Path:
    """Two whole-GPU twins on n0 that the kubelet admitted in the other order: the device plugin
    gave each the other's GPU (its gpu-allocated mark); a third pod's mark names another GPU
    than its record, but n1 has no fresh reading to tell which UUID is which index there."""
    def given(uuid: str) -> dict[str, str]:
        return {cv.ANNOTATION_GPU_ALLOCATED: json.dumps({"main": [uuid]})}

    nodes = [k8s_node("n0", annotations=_usage("n0", [(0, 100, []), (1, 100, [])])),
             k8s_node("n1")]
    pods = [k8s_pod("twin-a", node="n0", gpus=1, indices="0", annotations=given("GPU-n0-1")),
            k8s_pod("twin-b", namespace="other", node="n0", gpus=1, indices="1",
                    annotations=given("GPU-n0-0")),
            k8s_pod("unjudged", node="n1", gpus=1, indices="0",
                    annotations=given("GPU-n1-1"))]
    return _written(tmp_path / "misallocated.json", nodes, pods)


def test_a_pod_given_other_gpus_than_recorded_is_marked_and_listed(
        misallocated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(capsys, "--snapshot", str(misallocated))
    n0 = data["nodes"][0]  # type: ignore[index]
    assert [(h["pod"], h.get("misallocated")) for g in n0["gpus"] for h in g["holders"]] == [
        ("ns/twin-a", "other_gpus"), ("other/twin-b", "other_gpus")]
    assert [(m["pod"], m["node"], m["recorded"], m["given"])
            for m in data["misallocated_pods"]] == [  # type: ignore[attr-defined]
        ("ns/twin-a", "n0", [0], [1]), ("other/twin-b", "n0", [1], [0])]
    assert _json(capsys, "--snapshot", str(misallocated), "--namespace", "other")[
        "misallocated_pods"][0]["pod"] == "other/twin-b"  # type: ignore[index]
    assert inspect_main(["--snapshot", str(misallocated)]) == 0
    out = capsys.readouterr().out
    assert "    ns/twin-a: 1000 milli, asked whole, MISALLOCATED (other_gpus)" in out
    assert ("misallocated pod ns/twin-a on n0 (other_gpus): its containers got GPU(s) 1 but "
            "gpu-indices records 0: ") in out


def test_a_dra_mig_pod_shows_under_its_mig_gpu_with_its_profile_and_start() -> None:
    bare = k8s_node("n0", gpus=0)
    a100s = [Gpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81_920) for i in range(2)]
    slices = build_slices("n0", DRIVER_NAME, a100s, {0: True, 1: True})
    pod = k8s_pod("three", node="n0", spec_extra={
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c-three"}]})
    claim = {"metadata": {"name": "c-three", "namespace": "ns"},
             "status": {"allocation": {"devices": {"results": [{
                 "request": "gpu", "driver": DRIVER_NAME, "pool": "n0",
                 "device": mig_device_name(1, "3g.40gb", 4)}]}}}}
    snap, problems = build_snapshot([bare], [pod], [], UsageSource(8, NOW), claims=[claim],
                                    slices=slices)
    assert problems == []
    data = view(snap, [], node=None, namespace=None, threshold=0.25)
    (n0,) = data["nodes"]
    assert n0["gpus"] == [] and n0["mig_gpus"] == [
        {"index": 0, "product": "NVIDIA A100-SXM4-80GB", "dynamic": True, "instances": []},
        {"index": 1, "product": "NVIDIA A100-SXM4-80GB", "dynamic": True, "instances": [
            {"profile": "3g.40gb", "start": 4, "pods": ["ns/three"], "from": ["claims"]}]}]
    other = view(snap, [], node=None, namespace="other", threshold=0.25)
    assert other["nodes"] == []  # no pod of that namespace on the node
    lines = table(data, wide=False).splitlines()
    assert "  mig gpu 1 (DRA partitions, made per claim): 1 instance(s)" in lines
    assert "    3g.40gb at slice 4: ns/three" in lines


def test_a_device_plugin_mig_gpu_shows_the_agents_instances(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reading = NodeGpuUsage(node="n0", timestamp=NOW, interval_s=15.0, gpus=(GpuUsage(
        index=0, uuid="GPU-0", product="NVIDIA A100-SXM4-80GB", memory_used_mib=100,
        memory_total_mib=81_920, utilization_pct=0, pods=(PodGpuUsage("ns", "web", "uid-web",
                                                                      100),),
        mig=(MigInstanceUsage("3g.40gb", 4, "MIG-a", 100, 40_960, pods=("uid-web",)),
             MigInstanceUsage("3g.40gb", 0, "MIG-b", 0, 40_960))),))
    nodes = [k8s_node("n0", gpus=0, annotations={cv.ANNOTATION_GPU_USAGE: reading.to_json()})]
    path = _written(tmp_path / "mig.json", nodes, [k8s_pod("web", node="n0")])
    data = _json(capsys, "--snapshot", str(path))
    (n0,) = data["nodes"]  # type: ignore[misc]
    assert n0["mig_gpus"] == [{"index": 0, "product": "NVIDIA A100-SXM4-80GB", "dynamic": False,
                               "instances": [
        {"profile": "3g.40gb", "start": 0, "pods": [], "from": ["agent"]},
        {"profile": "3g.40gb", "start": 4, "pods": ["ns/web"], "from": ["agent"]}]}]
