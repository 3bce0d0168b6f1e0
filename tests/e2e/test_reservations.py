"""GPU reservations through the real API server: the extender lists and watches them (CRD from
manifests/base), holds them again after a restart, and lets them go when they are deleted.

The extender runs in this process (``cluster_runtime``, as ``gpufrag extender`` serves it) so
the test can ask its filter directly; no kube-scheduler is involved.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from defrag.controller.executor import EVENT_REASON_STALE_RESERVATION
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import delete_nodes, gpu_pod, install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.cli import main as gpufrag
from scheduler.extender.config import config_from_mapping
from scheduler.extender.runtime import Runtime, cluster_runtime
from scheduler.kube import reservations as rsv
from scheduler.kube.convert import pod_to_k8s
from scheduler.kube.reservations import Reservation
from tests.builders import pod
from tests.tenants import tenant_client

pytestmark = pytest.mark.e2e

WAIT_S = 30.0


def started(control_plane: ControlPlane) -> Runtime:
    config = config_from_mapping({"maintenance_interval_s": 0.2, "watch": {"timeout_s": 5}})
    runtime = cluster_runtime(control_plane.new_api_client, config)
    runtime.start()
    wait_until(lambda: runtime.extender.ready or None, timeout_s=WAIT_S,
               what="the extender to list and watch")
    return runtime


def passes(runtime: Runtime, obj: dict[str, Any], node: str) -> bool:
    return bool(runtime.extender.filter(obj, [node]).passed[0])


def test_the_extender_holds_a_reservation_across_a_restart_until_it_is_deleted(
        control_plane: ControlPlane) -> None:
    install_reservations_crd(control_plane)
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    node = f"rsv-{uuid.uuid4().hex[:6]}"
    control_plane.create_gpu_node(node, 1, "Tesla-T4", 16_384)
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    name = f"{node}-hold"
    competitor = pod_to_k8s(pod("other", gpu_milli=500), uid="c-1", owner="other-rs")
    replacement = pod_to_k8s(pod("web-b", gpu_milli=500), uid="r-1", owner="rs-1")
    runtime = started(control_plane)
    try:
        assert passes(runtime, competitor, node)
        custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL, rsv.body(Reservation(
                name=name, node=node, gpus=(0,), gpu_milli=600, owner_uid="rs-1",
                namespace="default", expires=time.time() + 300, replaces="default/web-a")))
        wait_until(lambda: not passes(runtime, competitor, node) or None, timeout_s=WAIT_S,
                   what="the watch to deliver the reservation")
        assert passes(runtime, replacement, node)
    finally:
        runtime.stop()
    runtime = started(control_plane)  # a new process would do the same: list, then watch
    try:
        assert len(runtime.cache.reservations) == 1
        assert not passes(runtime, competitor, node) and passes(runtime, replacement, node)
        custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                               rsv.PLURAL, name)
        wait_until(lambda: passes(runtime, competitor, node) or None, timeout_s=WAIT_S,
                   what="the watch to deliver the deletion")
    finally:
        runtime.stop()
        delete_nodes(control_plane, [node])


def test_another_tenant_naming_the_owner_cannot_take_its_reservation(
        control_plane: ControlPlane, tmp_path: Path) -> None:
    """An ordinary user of another namespace (``edit`` there) creates a pod whose controller
    reference names the reserved-for ReplicaSet's UID (the API server lets anyone write owner
    references): the extender judges it as an ordinary pod, so the reserved share stays taken
    for it, and the owner's own replacement still gets it."""
    install_reservations_crd(control_plane)
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    suffix = uuid.uuid4().hex[:6]
    owners, others = (control_plane.create_namespace(f"{who}-{suffix}") for who in ("web", "b"))
    user = kubernetes.client.CoreV1Api(tenant_client(control_plane, others, tmp_path))
    node = f"rsv-{suffix}"
    control_plane.create_gpu_node(node, 1, "Tesla-T4", 16_384)
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    runtime = started(control_plane)
    try:
        custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL, rsv.body(Reservation(
                name=f"{node}-hold", node=node, gpus=(0,), gpu_milli=600, owner_uid="rs-web",
                namespace=owners, expires=time.time() + 300, replaces=f"{owners}/web-a")))
        wait_until(lambda: len(runtime.cache.reservations) or None, timeout_s=WAIT_S,
                   what="the watch to deliver the reservation")
        body = gpu_pod("thief", milli=500, scheduler="nobody")
        body["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                                "name": "web", "uid": "rs-web",
                                                "controller": True}]
        # The object as the API server stored it (the garbage collector deletes it soon, its
        # owner not being in its namespace: what kube-scheduler would have sent meanwhile).
        created = user.create_namespaced_pod(others, body)
        obj = control_plane.api_client().sanitize_for_serialization(created)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "rs-web"
        assert not passes(runtime, obj, node)  # an ordinary pod: the reserved share is taken
        assert runtime.cache.reservations.refused == 1
        core = kubernetes.client.CoreV1Api(control_plane.api_client())
        events = wait_until(lambda: [e for e in core.list_namespaced_event(
            others, field_selector="involvedObject.name=thief").items
            if e.reason == "GpufragReservationRefused"] or None, timeout_s=WAIT_S,
            what="the Warning Event on the pod that named another namespace's owner")
        assert events[0].type == "Warning" and f"namespace {owners}" in events[0].message
        replacement = pod_to_k8s(pod("web-b", namespace=owners, gpu_milli=500), uid="r-web",
                                 owner="rs-web")
        assert passes(runtime, replacement, node)
    finally:
        runtime.stop()
        with suppress(kubernetes.client.ApiException):  # no reservation left for other tests
            custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                                   rsv.PLURAL, f"{node}-hold")
        delete_nodes(control_plane, [node])


def test_a_reservation_whose_owner_is_gone_is_reported_released_and_its_gpu_freed(
        control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> None:
    """A reservation made for the replacement of a pod whose owner is then deleted (no pod of
    it exists any more) blocks its GPU for nothing: ``gpufrag inspect`` marks it stale with
    why, a dry-run cycle only says it would release it, a real cycle deletes it (touching no
    pod: it moves none here) and the extender's watch gives the GPU back to other pods."""
    install_reservations_crd(control_plane)
    control_plane.ensure_namespace(cv.HINTS_NAMESPACE)
    suffix = uuid.uuid4().hex[:6]
    owners = control_plane.create_namespace(f"gone-{suffix}")
    node = f"rsv-{suffix}"
    name = f"{node}-hold"
    control_plane.create_gpu_node(node, 1, "Tesla-T4", 16_384)
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    kubeconfig = str(control_plane.kubeconfig_path)
    other = pod_to_k8s(pod("other", gpu_milli=500), uid="o-1", owner="other-rs")
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    with suppress(kubernetes.client.ApiException):  # as the manifests make it (409: made)
        core.create_namespaced_config_map(cv.HINTS_NAMESPACE, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": cv.HINTS_CONFIGMAP}})
    runtime = started(control_plane)
    try:
        custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL, rsv.body(Reservation(
                name=name, node=node, gpus=(0,), gpu_milli=1000, owner_uid="rs-deleted",
                owner_kind="ReplicaSet", owner_name="web-7d", namespace=owners,
                expires=time.time() + 600, replaces=f"{owners}/web-7d-a")))
        wait_until(lambda: not passes(runtime, other, node) or None, timeout_s=WAIT_S,
                   what="the watch to deliver the reservation")
        capsys.readouterr()
        assert gpufrag(["inspect", "--kubeconfig", kubeconfig, "--node", node, "-o", "json",
                        "--orphan-grace-s", "0"]) == 0
        data = json.loads(capsys.readouterr().out)
        (stale,) = data["stale_reservations"]
        assert (stale["reservation"], stale["reason"], stale["released_by_defrag"]) == (
            name, "owner_gone", True)
        assert f"ReplicaSet {owners}/web-7d has no pod" in stale["detail"]
        (held,) = data["nodes"][0]["gpus"][0]["holders"]
        assert (held["reservation"], held["stale"]) == (name, "owner_gone")
        cycle = ["defrag", "--kubeconfig", kubeconfig, "--namespaces", owners,
                 "--orphan-grace-s", "0", "--output", "json"]
        assert gpufrag([*cycle, "--dry-run"]) == 0
        result = [json.loads(line) for line in capsys.readouterr().out.splitlines()
                  if line.startswith("{")][-1]
        # (Other tests' leftovers may be stale too: at least ours.)
        assert result["counts"].get("stale reservations (owner_gone)", 0) >= 1, result
        assert [o["metadata"]["name"] for o in custom.list_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL)["items"]
            if o["metadata"]["name"] == name] == [name]
        assert not passes(runtime, other, node)

        def stale_events() -> list[Any]:
            return [e for e in core.list_namespaced_event(cv.HINTS_NAMESPACE).items
                    if e.reason == EVENT_REASON_STALE_RESERVATION
                    and e.involved_object.name == name]

        assert stale_events() == []  # a dry run writes no Event either
        assert gpufrag(cycle) == 0
        result = [json.loads(line) for line in capsys.readouterr().out.splitlines()
                  if line.startswith("{")][-1]
        assert result["counts"].get("reservations pruned", 0) >= 1, result
        (event,) = stale_events()
        assert (event.involved_object.kind, event.type) == (rsv.KIND, "Warning")
        assert event.message.startswith("holds GPU capacity for nothing (owner_gone): ")
        assert event.message.endswith("; released by this cycle"), event.message
        assert result["moves"] == [] and result["ok"], result
        assert name not in {o["metadata"]["name"] for o in custom.list_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE, rsv.PLURAL)["items"]}
        wait_until(lambda: passes(runtime, other, node) or None, timeout_s=WAIT_S,
                   what="the extender to give the freed GPU back")
    finally:
        runtime.stop()
        with suppress(kubernetes.client.ApiException):
            custom.delete_namespaced_custom_object(rsv.GROUP, rsv.VERSION, cv.HINTS_NAMESPACE,
                                                   rsv.PLURAL, name)
        delete_nodes(control_plane, [node])
