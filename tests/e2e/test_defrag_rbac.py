"""Reservations and recommendations under manifests/base RBAC, with real ServiceAccount tokens.

The defrag controller creates, renews, prunes and deletes GPUReservations in its namespace (and
nowhere else) and patches the recommendation annotation on a Deployment; the extender lists and
watches reservations and may not write them.
"""

from __future__ import annotations

import json
import time

import kubernetes
import pytest

from defrag.controller.executor import KubeActions
from defrag.rightsizing.workloads import Workload, WorkloadClient
from devkit.controlplane import ControlPlane
from devkit.stack import install_reservations_crd
from gpufrag import conventions as cv
from gpufrag.cli import main as gpufrag
from scheduler.kube import reservations as rsv
from scheduler.kube.reservations import Reservation
from tests.e2e.test_rbac import NODE, NS, Clients, _forbidden
from tests.e2e.test_rbac import as_service_account as as_service_account  # the fixture

pytestmark = pytest.mark.e2e


def reservation(name: str, expires: float) -> Reservation:
    return Reservation(name=name, node=NODE, gpus=(0,), gpu_milli=300, owner_uid="owner-1",
                       owner_kind="ReplicaSet", owner_name="web-1", namespace="default",
                       expires=expires, replaces="default/web-1-a")


def test_defrag_reserves_and_publishes_with_its_service_account(
        control_plane: ControlPlane, as_service_account: Clients, namespace: str) -> None:
    install_reservations_crd(control_plane)
    client = as_service_account("gpufrag-defrag")
    actions = KubeActions(client)
    now = time.time()
    actions.reserve(reservation("rbac-live", now + 600))
    actions.reserve(reservation("rbac-old", now + 600))
    actions.reserve(reservation("rbac-old", now - 1))  # made again: updated in place (409)
    actions.renew_reservation("rbac-live", now + 900)
    actions.release("rbac-old")  # expired: what a cycle releases (defrag.controller.ledger)
    admin = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    left = [o for o in admin.list_namespaced_custom_object(rsv.GROUP, rsv.VERSION, NS,
                                                           rsv.PLURAL)["items"]
            if o["metadata"]["name"].startswith("rbac-")]  # other modules' may be there too
    assert [o["metadata"]["name"] for o in left] == ["rbac-live"]
    assert rsv.reservation_from_k8s(left[0]).expires == pytest.approx(now + 900, abs=1)
    actions.release("rbac-live")
    actions.release("rbac-live")  # gone already: fine
    custom = kubernetes.client.CustomObjectsApi(client)
    assert _forbidden(lambda: custom.create_namespaced_custom_object(
        rsv.GROUP, rsv.VERSION, namespace, rsv.PLURAL, rsv.body(reservation("x", now + 60))))

    apps = kubernetes.client.AppsV1Api(control_plane.api_client())
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d"}}, "template": {
            "metadata": {"labels": {"app": "d"}},
            "spec": {"containers": [{"name": "main", "image": "gpufrag-e2e:none"}]}}}})
    workloads = WorkloadClient(client)
    found = workloads.resolve(namespace, [{"kind": "Deployment", "name": "d", "uid": "",
                                           "controller": True}])
    assert found is not None
    workloads.patch_annotation(Workload("Deployment", namespace, "d", found.uid),
                               cv.ANNOTATION_GPU_RECOMMENDATION, "{}")
    annotations = apps.read_namespaced_deployment("d", namespace).metadata.annotations
    assert annotations[cv.ANNOTATION_GPU_RECOMMENDATION] == "{}"
    mine = kubernetes.client.AppsV1Api(client)
    assert _forbidden(lambda: mine.delete_namespaced_deployment("d", namespace))


def test_extender_reads_reservations_and_cannot_write_them(
        control_plane: ControlPlane, as_service_account: Clients) -> None:
    install_reservations_crd(control_plane)
    custom = kubernetes.client.CustomObjectsApi(as_service_account("gpufrag-scheduler"))
    listing = custom.list_namespaced_custom_object(rsv.GROUP, rsv.VERSION, NS, rsv.PLURAL)
    assert isinstance(listing["items"], list)  # it may read them (other modules' may be there)
    body = rsv.body(reservation("from-the-extender", time.time() + 60))
    assert _forbidden(lambda: custom.create_namespaced_custom_object(
        rsv.GROUP, rsv.VERSION, NS, rsv.PLURAL, body))
    assert _forbidden(lambda: custom.delete_namespaced_custom_object(
        rsv.GROUP, rsv.VERSION, NS, rsv.PLURAL, "anything"))


def test_inspect_runs_under_the_shipped_read_only_role_and_can_write_nothing(
        control_plane: ControlPlane, as_service_account: Clients,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A service account bound to manifests/base's gpufrag-inspect ClusterRole (and nothing
    else) runs ``gpufrag inspect`` on the whole cluster, and may not write what it reads."""
    install_reservations_crd(control_plane)
    admin = control_plane.api_client()
    kubernetes.client.CoreV1Api(admin).create_namespaced_service_account(
        NS, {"metadata": {"name": "inspector"}})
    kubernetes.client.RbacAuthorizationV1Api(admin).create_cluster_role_binding({
        "metadata": {"name": "e2e-inspector"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "gpufrag-inspect"},
        "subjects": [{"kind": "ServiceAccount", "name": "inspector", "namespace": NS}]})
    try:
        client = as_service_account("inspector")
        capsys.readouterr()
        assert gpufrag(["inspect", "--kubeconfig", str(client.kubeconfig_path), "--node", NODE,
                        "-o", "json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert [n["node"] for n in data["nodes"]] == [NODE]
        assert not any("no GPUReservation" in n for n in data["notes"]), data["notes"]
        # --summary also reads the defrag state on the hints ConfigMap, by its name only
        assert gpufrag(["inspect", "--kubeconfig", str(client.kubeconfig_path), "--summary",
                        "-o", "json"]) == 0
        evictions = json.loads(capsys.readouterr().out)["summary"]["evictions"]
        assert "may not get it" not in evictions["detail"], evictions
        core = kubernetes.client.CoreV1Api(client)
        custom = kubernetes.client.CustomObjectsApi(client)
        assert _forbidden(lambda: core.patch_node(NODE, {"metadata": {"labels": {"x": "y"}}}))
        assert _forbidden(lambda: core.delete_collection_namespaced_pod("default"))
        assert _forbidden(lambda: custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, NS, rsv.PLURAL, rsv.body(reservation("x", time.time()))))
    finally:
        kubernetes.client.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(
            "e2e-inspector")
