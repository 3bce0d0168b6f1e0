"""The MIG step's facts from Kubernetes objects: which nodes are MIG nodes, which are drained,
and what pods ask."""

from __future__ import annotations

from typing import Any

from defrag.controller.migfacts import mig_facts
from gpufrag.gpu_usage import (
    GpuUsage,
    MigInstanceUsage,
    NodeGpuUsage,
    PodGpuUsage,
    StrayProcess,
)
from scheduler.core.mig import MIG_MODELS
from scheduler.kube.reservations import Reservation

NOW = 1_800_000_000.0


def mig_node(name: str, *, labels: dict[str, str] | None = None,
             offers: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as the GPU operator publishes a MIG node (mixed strategy)."""
    return {"metadata": {"name": name, "labels": {
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.count": "2",
                "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-1g.10gb",
                **(labels or {})}},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "0",
                                       **(offers if offers is not None else
                                          {"nvidia.com/mig-1g.10gb": "14"})}}}


def pod(name: str, requests: dict[str, str], *, node: str = "",
        phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {
                "requests": {"cpu": "1", **requests}, "limits": requests}}]},
            "status": {"phase": phase}}


def facts(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kw: Any) -> Any:
    return mig_facts(nodes, pods, kw.pop("readings", {}), kw.pop("reservations", ()),
                     cordoned=kw.pop("cordoned", frozenset()), now=NOW,
                     dynamic=kw.pop("dynamic", frozenset()))


def test_a_mig_node_with_nothing_on_it_is_drained_and_read_from_its_labels() -> None:
    (node,) = facts([mig_node("a")], []).nodes
    assert (node.name, node.model, node.gpus, node.config, node.offers, node.drained) == (
        "a", MIG_MODELS["A100-80GB"], 2, "all-1g.10gb", {"1g.10gb": 14}, True)


def test_a_plain_gpu_node_is_no_mig_node() -> None:
    plain = {"metadata": {"name": "t4", "labels": {"nvidia.com/gpu.product": "Tesla-T4"}},
             "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    assert facts([plain], []).nodes == []
    # mixed strategy with MIG all off still counts: it is the MIG manager's to cut.
    off = mig_node("off", labels={"nvidia.com/mig.config": "all-disabled"}, offers={})
    assert [n.name for n in facts([off], []).nodes] == ["off"]


def test_pods_asking_any_gpu_resource_make_a_node_busy_and_mig_asks_are_counted() -> None:
    pods = [pod("bert", {"nvidia.com/mig-1g.10gb": "2"}, node="a"),
            pod("whole", {"nvidia.com/gpu": "1"}, node="b"),
            pod("cpu", {}, node="c"),
            pod("done", {"nvidia.com/mig-1g.10gb": "1"}, node="c", phase="Succeeded"),
            pod("waiting", {"nvidia.com/mig-3g.40gb": "2"}, phase="Pending")]
    found = facts([mig_node(n) for n in "abc"], pods)
    a, b, c = found.nodes
    assert (a.busy, a.asks) == (("serving/bert",), {"1g.10gb": 2})
    assert b.busy == ("serving/whole",)
    assert c.drained and c.asks == {}
    assert found.pending == {"3g.40gb": 2} and found.problems == []


def test_the_agent_seeing_gpu_processes_makes_a_node_busy() -> None:
    gpu = GpuUsage(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 13, 81920, 0)
    with_pod = NodeGpuUsage("a", NOW, 15.0, (
        GpuUsage(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 400, 81920, 0,
                 pods=(PodGpuUsage("x", "y", "uid-y", 400),)),))
    with_stray = NodeGpuUsage("b", NOW, 15.0, (
        GpuUsage(0, "GPU-1", "NVIDIA A100-SXM4-80GB", 13, 81920, 0,
                 strays=(StrayProcess(7, 13, "no_pod"),)),))
    idle = NodeGpuUsage("c", NOW, 15.0, (gpu,))  # memory alone (driver) is not use
    found = facts([mig_node(n) for n in "abc"], [],
                  readings={"a": with_pod, "b": with_stray, "c": idle})
    assert [n.busy for n in found.nodes] == [("the node agent sees GPU processes",)] * 2 + [()]


def test_live_reservations_and_cordons_are_carried() -> None:
    live = Reservation("r-live", "a", (0,), 1000, "owner", expires=NOW + 60)
    gone = Reservation("r-old", "b", (0,), 1000, "owner", expires=NOW - 1)
    a, b = facts([mig_node("a"), mig_node("b")], [], reservations=[live, gone],
                 cordoned=frozenset({"b"})).nodes
    assert (a.reservations, a.cordoned) == (("r-live",), False)
    assert (b.reservations, b.cordoned) == ((), True)


def test_an_unreadable_mig_ask_is_reported_and_still_makes_its_node_busy() -> None:
    found = facts([mig_node("a")], [pod("odd", {"nvidia.com/mig-1g.10gb": "500m"}, node="a")])
    assert found.nodes[0].busy == ("serving/odd",)
    assert len(found.problems) == 1 and "serving/odd" in found.problems[0]


def test_a_node_whose_mig_gpus_the_dra_driver_cuts_is_left_to_it() -> None:
    """The agent reads a DRA node's instances (made per claim): no MIG manager relabel
    concerns it, so the step leaves it out."""
    reading = NodeGpuUsage("dra", NOW, 15.0, (GpuUsage(
        0, "GPU-0", "NVIDIA A100-SXM4-80GB", 0, 81920, 0,
        mig=(MigInstanceUsage("3g.40gb", 4, "MIG-a", 0, 40_960),)),))
    plain = {"metadata": {"name": "dra", "labels": {}}, "status": {"allocatable": {}}}
    assert [n.name for n in facts([plain], [], readings={"dra": reading}).nodes] == ["dra"]
    assert facts([plain], [], readings={"dra": reading}, dynamic=frozenset({"dra"})).nodes == []
