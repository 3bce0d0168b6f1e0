"""Kubernetes objects -> snapshot: requests, GPUs, owners, usage (agent and DCGM), PDBs."""

from __future__ import annotations

from typing import Any

import pytest

from defrag.controller.measure import measure
from defrag.controller.model import (
    DELIVERY_CLAIMS,
    DELIVERY_DEVICE_PLUGIN,
    DELIVERY_DIRECT,
    MIG_FROM_AGENT,
    MIG_FROM_CLAIMS,
    HeldInstance,
    Taint,
)
from defrag.controller.snapshot import (
    GpuSample,
    UsageSource,
    build_snapshot,
    constraints_of,
    hold_reservations,
)
from gpufrag import conventions as cv
from gpufrag.gpu_usage import GpuUsage, MigInstanceUsage, NodeGpuUsage, PodGpuUsage
from node.dra.slices import build_slice, build_slices
from node.gpus import Gpu
from scheduler.core.mig import MigInstance
from scheduler.kube.reservations import Reservation, body
from tests.builders import workload
from tests.defrag.controller.builders import k8s_node, k8s_pdb, k8s_pod

NOW = 1_000_000.0
AGENT = UsageSource(stale_intervals=8, now=NOW)


def usage_annotation(node: str, gpus: list[tuple[int, int, list[tuple[str, str, int]]]],
                     *, age_s: float = 10.0, interval_s: float = 15.0) -> dict[str, str]:
    """gpus: (index, used MiB, [(pod name, uid, MiB)])."""
    reading = NodeGpuUsage(node=node, timestamp=NOW - age_s, interval_s=interval_s, gpus=tuple(
        GpuUsage(index=i, uuid=f"GPU-{node}-{i}", product="Tesla-T4", memory_used_mib=used,
                 memory_total_mib=16_384, utilization_pct=10,
                 pods=tuple(PodGpuUsage("ns", n, u, mib) for n, u, mib in pods))
        for i, used, pods in gpus))
    return {cv.ANNOTATION_GPU_USAGE: reading.to_json()}


def test_pods_land_on_recorded_gpus_with_their_facts() -> None:
    nodes = [k8s_node("n0", annotations=usage_annotation(
        "n0", [(0, 0, []), (1, 3000, [("a", "uid-a", 2500)])]))]
    pods = [
        k8s_pod("a", node="n0", milli=500, indices="1", labels={"app": "web"}, priority=5),
        k8s_pod("d", node="n0", milli=200, owner="DaemonSet",
                annotations={cv.ANNOTATION_DEFRAG_MOVABLE: "false"}),
        k8s_pod("done", node="n0", gpus=1, phase="Succeeded"),
        k8s_pod("wait", gpus=1),
        k8s_pod("cpu-wait"),
        k8s_pod("ours", scheduler_name=cv.SCHEDULER_NAME),
        k8s_pod("elsewhere", node="gone-node", gpus=1),
    ]
    snap, problems = build_snapshot(nodes, pods, [k8s_pdb("web", match={"app": "web"})], AGENT)
    assert problems == [] and snap.notes == []
    state = snap.state
    assert {k: (p.node, p.gpus) for k, p in state.pods.items()} == {
        "ns/a": ("n0", (1,)), "ns/d": ("n0", (1,))}  # d: the tightest GPU that fits
    a, d = snap.pods["ns/a"], snap.pods["ns/d"]
    assert (a.owner_kind, a.owner_uid, a.priority, a.running, a.uid) == (
        "ReplicaSet", "owner-a", 5, True, "uid-a")
    assert (d.owner_kind, d.opted_out) == ("DaemonSet", True)
    assert [p.key for p in snap.pending] == ["ns/wait", "ns/ours"]
    assert [b.key for b in snap.pdbs_of(a)] == ["ns/web"] and snap.pdbs_of(d) == []
    # The agent's figure for a; d has none and gets what a does not explain of GPU1's 3000.
    assert snap.usage.pod_used_mib == {"ns/a": 2500.0, "ns/d": 500.0}
    assert snap.usage.other_mib[0, 1] == 0.0
    m = measure(state, snap.usage, workload((1000, 1, 1000, 1.0)))
    # GPU1: 700 milli of 16 GiB = 11468.8 MiB reserved, 3000 used; GPU0: nothing reserved.
    assert m.idle_mib[0] == pytest.approx(11468.8 - 3000)


def test_gpu_indices_fall_back_to_what_the_agent_saw() -> None:
    nodes = [k8s_node("n0", annotations=usage_annotation(
        "n0", [(0, 0, []), (1, 100, [("a", "uid-a", 100)])]))]
    snap, _ = build_snapshot(nodes, [k8s_pod("a", node="n0", milli=300)], [], AGENT)
    assert snap.state.pods["ns/a"].gpus == (1,)


def test_stale_and_unreadable_usage_is_ignored_and_reported() -> None:
    nodes = [
        k8s_node("old", annotations=usage_annotation("old", [(0, 1, [])], age_s=8 * 15 + 1)),
        k8s_node("bad", annotations={cv.ANNOTATION_GPU_USAGE: "{not json"}),
        k8s_node("none"),
    ]
    snap, _ = build_snapshot(nodes, [], [], AGENT)
    notes = {n.node: n.reason for n in snap.notes}
    assert notes["old"].startswith("usage reading 121s old (> 8 x 15s)")
    assert notes["bad"].startswith("unreadable usage annotation")
    assert "none" not in notes
    assert not snap.usage.known.any()


def test_gpu_memory_from_the_agent_when_the_label_is_missing() -> None:
    nodes = [k8s_node("n0", memory_mib=None, annotations=usage_annotation("n0", [(0, 5, [])]))]
    snap, _ = build_snapshot(nodes, [], [], AGENT)
    assert int(snap.state.gpu_memory_mib[0]) == 16_384


def test_dcgm_samples_replace_the_annotation() -> None:
    nodes = [k8s_node("n0", annotations=usage_annotation("n0", [(0, 1, []), (1, 1, [])]))]
    pods = [k8s_pod("a", node="n0", milli=500, indices="0"),
            k8s_pod("b", node="n0", milli=500, indices="0")]
    samples = [GpuSample("n0", 0, 6000.0, NOW - 5, "ns", "a"),
               GpuSample("n0", 0, 6000.0, NOW - 5, "ns", "b"),
               GpuSample("n0", 1, 50.0, NOW - 10_000),  # stale
               GpuSample("other", 0, 1.0, NOW)]
    source = UsageSource(stale_intervals=8, now=NOW, dcgm=samples, dcgm_interval_s=30)
    snap, _ = build_snapshot(nodes, pods, [], source)
    assert snap.usage.known[0].tolist()[:2] == [True, False]
    assert snap.usage.pod_used_mib == {"ns/a": 3000.0, "ns/b": 3000.0}
    assert [n.node for n in snap.notes] == ["n0"] and "DCGM samples" in snap.notes[0].reason


def test_dcgm_peaks_make_the_idle_ratio_read_the_window_not_the_instant() -> None:
    # Two 500-milli pods on GPU 0 use 6,000 MiB between them now, 12,000 at the window's peak.
    nodes = [k8s_node("n0")]
    pods = [k8s_pod("a", node="n0", milli=500, indices="0"),
            k8s_pod("b", node="n0", milli=500, indices="0")]
    samples = [GpuSample("n0", 0, 6000.0, NOW - 5, "ns", name, peak_mib=12_000.0)
               for name in ("a", "b")]
    source = UsageSource(stale_intervals=8, now=NOW, dcgm=samples, dcgm_interval_s=30)
    snap, _ = build_snapshot(nodes, pods, [], source)
    assert snap.usage.pod_peak_mib == {"ns/a": 6000.0, "ns/b": 6000.0}
    reserved = float(snap.state.gpu_memory_mib[0])  # both halves: the whole GPU
    summary = measure(snap.state, snap.usage, workload((1000, 1, 1000, 1.0))).summary
    assert summary.idle_gib * 1024 == pytest.approx(reserved - 12_000)
    assert summary.burst_headroom_gib * 1024 == pytest.approx(6000)
    # Without the peak (the series is newer than the window), the instant figure stands.
    plain = [GpuSample("n0", 0, 6000.0, NOW - 5, "ns", name) for name in ("a", "b")]
    snap, _ = build_snapshot(nodes, pods, [], UsageSource(stale_intervals=8, now=NOW,
                                                          dcgm=plain, dcgm_interval_s=30))
    assert snap.usage.pod_peak_mib == {}


def test_bad_objects_are_skipped_with_a_reason() -> None:
    bad = k8s_pod("x", node="n0", milli=1500)
    owners = k8s_pod("y", node="n0", milli=500)
    owners["metadata"]["ownerReferences"] = {"kind": "ReplicaSet"}  # a mapping, not a list
    snap, problems = build_snapshot([k8s_node("n0")], [bad, owners], [], AGENT)
    assert len(problems) == 2 and "ns/x" in problems[0]
    assert "ns/y" in problems[1] and "ownerReferences" in problems[1]
    # Unreadable owners: still holding its share where it runs, but never a candidate to move.
    assert set(snap.state.pods) == {"ns/y"} and snap.pods["ns/y"].owner_kind == ""


def test_constraints_taints_and_cordon() -> None:
    pod = k8s_pod("a", spec_extra={
        "nodeSelector": {"pool": "gold"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["z1", "z2"]}]}]}}}})
    c = constraints_of(pod)
    gpu_taint = (Taint("gpu", "", "NoSchedule"),)
    assert c.allows({"pool": "gold", "zone": "z1"}, gpu_taint)
    assert not c.allows({"pool": "gold", "zone": "z3"})
    assert not c.allows({"zone": "z1"})
    assert not constraints_of(k8s_pod("b")).allows({}, gpu_taint)
    assert constraints_of(k8s_pod("b")).allows({}, (Taint("x", "", "PreferNoSchedule"),))
    nodes = [k8s_node("n0", unschedulable=True,
                      taints=[{"key": "gpu", "effect": "NoSchedule"}])]
    snap, _ = build_snapshot(nodes, [], [], AGENT)
    assert snap.cordoned == frozenset({"n0"}) and snap.taints["n0"] == gpu_taint


def test_a_right_sized_pod_whose_container_was_oom_killed_is_marked() -> None:
    changed = {cv.ANNOTATION_RIGHTSIZING_CHANGE: '{"from": 500, "to": 300}'}
    pods = []
    for name, notes in (("sized", changed), ("asked", {})):
        pod = k8s_pod(name, node="n0", milli=300, annotations=notes)
        pod["status"]["containerStatuses"] = [{
            "name": "main", "state": {"running": {}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]
        pods.append(pod)
    snap, _ = build_snapshot([k8s_node("n0")], pods, [], AGENT)
    # Only the pod right-sizing changed is the guard's business.
    assert snap.pods["ns/sized"].out_of_memory and not snap.pods["ns/asked"].out_of_memory


def dra_pod(name: str, node: str = "") -> dict[str, Any]:
    """A pod whose GPU comes through its claim ``c-<name>`` (made from a template)."""
    obj = k8s_pod(name, node=node, spec_extra={
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "quarter"}]})
    obj["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": f"c-{name}"}]
    return obj


def dra_claim(name: str, milli: int, device: str = "", pool: str = "n0") -> dict[str, Any]:
    """Claim ``c-<name>`` asking ``milli`` of a GPU; allocated ``device`` of ``pool`` if any."""
    claim: dict[str, Any] = {
        "metadata": {"name": f"c-{name}", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.gpufrag.io",
            "capacity": {"requests": {"milli": str(milli)}}}}]}},
        "status": {}}
    if device:
        claim["status"]["allocation"] = {"devices": {"results": [{
            "request": "gpu", "driver": "gpu.gpufrag.io", "pool": pool, "device": device,
            "consumedCapacity": {"milli": str(milli)}}]}}
    return claim


def test_dra_pods_hold_their_claims_allocation_and_pending_ones_ask_it() -> None:
    # b's claim took gpu-1 although gpu-0 (where a share recorded by annotation sits) is the
    # tightest: the allocation, not the default rule, says where it is.
    pods = [k8s_pod("a", node="n0", milli=500, indices="0"), dra_pod("b", "n0"),
            dra_pod("wait"), dra_pod("lost", "n0")]
    claims = [dra_claim("b", 250, "gpu-1"), dra_claim("wait", 300), dra_claim("lost", 400)]
    snap, problems = build_snapshot([k8s_node("n0")], pods, [], AGENT, claims=claims)
    assert problems == []
    assert {k: (p.node, p.gpus, p.pod.gpu_milli) for k, p in snap.state.pods.items()} == {
        "ns/a": ("n0", (0,), 500), "ns/b": ("n0", (1,), 250),
        "ns/lost": ("n0", (), 0)}  # bound, its claim not allocated: CPU and memory only
    (wait,) = snap.pending
    assert (wait.key, wait.request.num_gpu, wait.request.gpu_milli) == ("ns/wait", 1, 300)
    # Without its claims, a DRA pod holds no GPU (and a pending one asks none).
    bare, _ = build_snapshot([k8s_node("n0")], pods, [], AGENT)
    assert bare.state.pods["ns/b"].gpus == () and bare.pending == []


def test_the_snapshot_says_how_each_pod_gets_its_gpus() -> None:
    """Device plugin (its record), claims made for it (a replacement gets new ones), or a
    claim its spec names (the claim stays: the planner does not move it)."""
    direct = k8s_pod("d", node="n0", spec_extra={
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "c-d"}]})
    pods = [k8s_pod("a", node="n0", milli=500, indices="0"), dra_pod("b", "n0"), direct]
    claims = [dra_claim("b", 250, "gpu-1"), dra_claim("d", 250, "gpu-1")]
    snap, problems = build_snapshot([k8s_node("n0")], pods, [], AGENT, claims=claims)
    assert problems == []
    assert {k: p.delivery for k, p in snap.pods.items()} == {
        "ns/a": DELIVERY_DEVICE_PLUGIN, "ns/b": DELIVERY_CLAIMS, "ns/d": DELIVERY_DIRECT}


def test_a_reservation_holds_its_share_beside_a_dra_allocation() -> None:
    snap, _ = build_snapshot([k8s_node("n0")], [dra_pod("b", "n0")], [], AGENT,
                             claims=[dra_claim("b", 600, "gpu-0")])
    held = Reservation(name="r", node="n0", gpus=(1,), gpu_milli=700, owner_uid="o",
                       namespace="ns", expires=NOW + 60)
    assert hold_reservations(snap, [body(held)], NOW) == []
    row = snap.state.index["n0"]
    assert snap.state.gpu_free[row, :2].tolist() == [400, 300]


def test_an_unnamed_claim_is_a_problem_line() -> None:
    _, problems = build_snapshot([k8s_node("n0")], [], [], AGENT, claims=[{"metadata": {}}])
    assert len(problems) == 1 and problems[0].startswith("ResourceClaim None:")


def test_a_node_the_device_plugin_left_has_the_gpus_of_its_slice() -> None:
    bare = k8s_node("n0", gpus=0)  # allocatable nvidia.com/gpu 0: DRA serves the node
    published = build_slice("n0", "gpu.gpufrag.io",
                            [Gpu(i, f"GPU-{i}", "Tesla-T4", 16_384) for i in range(2)], {})
    snap, problems = build_snapshot([bare], [dra_pod("b", "n0")], [], AGENT,
                                    claims=[dra_claim("b", 250, "gpu-1")], slices=[published])
    assert problems == []
    row = snap.state.index["n0"]
    assert snap.state.gpu_free[row, :2].tolist() == [1000, 750]
    alone, _ = build_snapshot([bare], [], [], AGENT)
    assert int(alone.state.gpu_count[alone.state.index["n0"]]) == 0
    broken = {**published, "spec": {**published["spec"], "devices": "none"}}
    _, problems = build_snapshot([bare], [], [], AGENT, slices=[broken])
    assert problems == ["ResourceSlice n0-gpu.gpufrag.io: field 'spec.devices': 'none' is not "
                        "a list"]


def mig_claim(name: str, device: str, pool: str = "n0") -> dict[str, Any]:
    """Claim ``c-<name>`` of a MIG profile's class, allocated the partition ``device``."""
    return {"metadata": {"name": f"c-{name}", "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "mig-3g.40gb.gpu.gpufrag.io"}}]}},
            "status": {"allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.gpufrag.io", "pool": pool,
                "device": device}]}}}}


def test_a_dra_mig_pod_shows_on_its_gpu_with_its_profile_and_start() -> None:
    """The driver's MIG node (every GPU partitioned) is a MIG node of the snapshot with both
    GPUs; each bound pod holds the partition its claim names, a pending one none, and its
    request stays CPU and memory (no GPU of the placement state)."""
    bare = k8s_node("n0", gpus=0)
    a100s = [Gpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81_920) for i in range(2)]
    slices = build_slices("n0", "gpu.gpufrag.io", a100s, {0: True, 1: True})
    pods = [dra_pod("three", "n0"), dra_pod("four", "n0"), dra_pod("wait")]
    claims = [mig_claim("three", "gpu-0-mig-3g-40gb-4"), mig_claim("four", "gpu-0-mig-4g-40gb-0"),
              mig_claim("wait", "gpu-1-mig-3g-40gb-4", pool="n1")]
    snap, problems = build_snapshot([bare], pods, [], AGENT, claims=claims, slices=slices)
    assert problems == []
    mig = snap.mig["n0"]
    assert mig.dynamic and mig.gpus == {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA A100-SXM4-80GB"}
    assert mig.instances == (
        HeldInstance(MigInstance(0, "4g.40gb", 0, True), ("ns/four",), (MIG_FROM_CLAIMS,)),
        HeldInstance(MigInstance(0, "3g.40gb", 4, True), ("ns/three",), (MIG_FROM_CLAIMS,)))
    assert snap.state.pods["ns/three"].gpus == () and snap.state.pods["ns/three"].pod.num_gpu == 0
    # Nothing allocated: the node still shows its MIG GPUs, with no instance.
    empty, _ = build_snapshot([bare], [], [], AGENT, slices=slices)
    assert empty.mig["n0"].gpus.keys() == {0, 1} and empty.mig["n0"].instances == ()


def test_the_agents_mig_reading_and_a_claim_name_one_instance() -> None:
    """A device-plugin MIG node is shown from the agent's reading (its pods by key), and an
    instance both a claim and the reading name is one entry."""
    reading = NodeGpuUsage(node="n0", timestamp=NOW - 10, interval_s=15.0, gpus=(GpuUsage(
        index=0, uuid="GPU-0", product="NVIDIA A100-SXM4-80GB", memory_used_mib=100,
        memory_total_mib=81_920, utilization_pct=0, pods=(PodGpuUsage("ns", "three",
                                                                      "uid-three", 100),),
        mig=(MigInstanceUsage("3g.40gb", 4, "MIG-a", 100, 40_960, pods=("uid-three",)),
             MigInstanceUsage("3g.40gb", 0, "MIG-b", 0, 40_960))),))
    node = k8s_node("n0", gpus=0, annotations={cv.ANNOTATION_GPU_USAGE: reading.to_json()})
    snap, problems = build_snapshot([node], [dra_pod("three", "n0")], [], AGENT,
                                    claims=[mig_claim("three", "gpu-0-mig-3g-40gb-4")])
    assert problems == []
    mig = snap.mig["n0"]
    assert not mig.dynamic and mig.gpus == {0: "NVIDIA A100-SXM4-80GB"}
    assert mig.instances == (
        HeldInstance(MigInstance(0, "3g.40gb", 0, False), (), (MIG_FROM_AGENT,)),
        HeldInstance(MigInstance(0, "3g.40gb", 4, True), ("ns/three",),
                     (MIG_FROM_AGENT, MIG_FROM_CLAIMS)))
