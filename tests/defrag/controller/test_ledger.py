"""Which GPU reservations hold capacity for nothing (defrag.controller.ledger), and why."""

from __future__ import annotations

from typing import Any

from defrag.controller.ledger import OWNER_GRACE_S, misallocated_pods, stale_reservations
from defrag.controller.model import PodInfo
from gpufrag import conventions as cv
from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage
from gpufrag.records import AllocationMismatch
from scheduler.kube import reservations as rsv
from scheduler.kube.reservations import Reservation
from tests.builders import pod
from tests.defrag.controller.builders import k8s_pod

NOW = 1_800_000_000.0


def obj(name: str, *, node: str = "gpu-1", owner: str = "rs-1", namespace: str = "serving",
        expires: float = NOW + 600, age_s: float = OWNER_GRACE_S + 1,
        managed: bool = True) -> dict[str, Any]:
    body = rsv.body(Reservation(name=name, node=node, gpus=(0,), gpu_milli=500,
                                owner_uid=owner, owner_kind="ReplicaSet", owner_name="web-7d",
                                namespace=namespace, expires=expires))
    body["metadata"]["creationTimestamp"] = rsv.rfc3339(NOW - age_s)
    if not managed:
        body["metadata"]["labels"] = {}
    return body


def owned(key: str, owner: str) -> PodInfo:
    namespace, name = key.split("/")
    return PodInfo(key=key, request=pod(name, gpu_milli=500, namespace=namespace),
                   owner_kind="ReplicaSet", owner_uid=owner)


def reasons(objs: list[dict[str, Any]], pods: dict[str, PodInfo] | None = None,
            nodes: frozenset[str] = frozenset({"gpu-1"})) -> dict[str, str]:
    return {s.name: s.reason for s in stale_reservations(objs, pods or {}, nodes, NOW)}


def test_a_reservation_whose_owner_still_has_a_pod_is_live() -> None:
    pods = {"serving/web-a": owned("serving/web-a", "rs-1")}
    assert reasons([obj("live")], pods) == {}


def test_a_reservation_whose_owner_has_no_pod_past_the_grace_is_orphaned() -> None:
    (found,) = stale_reservations([obj("orphan")], {}, {"gpu-1"}, NOW)
    assert (found.reason, found.node, found.namespace, found.managed) == (
        "owner_gone", "gpu-1", "serving", True)
    assert "ReplicaSet serving/web-7d has no pod" in found.detail


def test_the_grace_covers_the_moment_before_the_replacement_is_created() -> None:
    assert reasons([obj("young", age_s=OWNER_GRACE_S - 1)]) == {}
    assert reasons([obj("no-stamp", age_s=0)]) == {}
    young = obj("young", age_s=5)
    assert [s.reason for s in stale_reservations([young], {}, {"gpu-1"}, NOW, grace_s=0)] == [
        "owner_gone"]


def test_only_the_owner_in_its_own_namespace_counts() -> None:
    """A pod elsewhere naming the owner's UID (anyone can write an ownerReference) does not
    keep the reservation alive, as it could not use it either."""
    pods = {"other/x": owned("other/x", "rs-1")}
    assert reasons([obj("orphan")], pods) == {"orphan": "owner_gone"}


def test_expired_node_gone_and_unreadable() -> None:
    broken = obj("broken")
    broken["spec"]["gpus"] = "zero"
    assert reasons([obj("old", expires=NOW), obj("away", node="gpu-9"), broken]) == {
        "old": "expired", "away": "node_gone", "broken": "unreadable"}


def test_a_reservation_someone_else_made_is_reported_as_not_ours() -> None:
    (found,) = stale_reservations([obj("theirs", managed=False)], {}, {"gpu-1"}, NOW)
    assert found.reason == "owner_gone" and not found.managed


READING = NodeGpuUsage("gpu-1", NOW, 15.0, tuple(
    GpuUsage(i, f"GPU-{i}", "A100", 0, 81_920, 0) for i in range(2)))


def marked(name: str, given: str, *, indices: str | None = "0", phase: str | None = None,
           node: str = "gpu-1") -> dict[str, Any]:
    return k8s_pod(name, node=node, gpus=1, indices=indices, phase=phase,
                   annotations={cv.ANNOTATION_GPU_ALLOCATED: given})


def test_only_live_recorded_pods_with_a_readable_mark_on_a_read_node_are_judged() -> None:
    wrong = '{"main": ["GPU-1"]}'
    pods = [marked("swapped", wrong), marked("right", '{"main": ["GPU-0"]}'),
            marked("done", wrong, phase="Succeeded"), marked("kubelet-chose", wrong, indices=None),
            marked("unreadable", "GPU-1"), marked("unread-node", wrong, node="gpu-2"),
            k8s_pod("unmarked", node="gpu-1", gpus=1, indices="0")]
    found = misallocated_pods(pods, {"gpu-1": READING}, cv.DEFAULT_NAMES)
    assert [(m.key, m.node, m.mismatch) for m in found] == [
        ("ns/swapped", "gpu-1", AllocationMismatch("other_gpus", (0,), (1,)))]
