"""GPU reservations through the real API server: the extender lists and watches them (CRD from
manifests/base), holds them again after a restart, and lets them go when they are deleted.

The extender runs in this process (``cluster_runtime``, as ``gpufrag extender`` serves it) so
the test can ask its filter directly; no kube-scheduler is involved.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import kubernetes
import pytest

from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from devkit.stack import delete_nodes
from gpufrag import conventions as cv
from scheduler.extender.config import config_from_mapping
from scheduler.extender.runtime import Runtime, cluster_runtime
from scheduler.kube import reservations as rsv
from scheduler.kube.convert import pod_to_k8s
from scheduler.kube.reservations import Reservation
from tests.builders import pod
from tests.e2e.test_defrag import install_reservations_crd

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
    if control_plane.kubectl("get", "namespace", cv.HINTS_NAMESPACE, check=False).returncode:
        control_plane.create_namespace(cv.HINTS_NAMESPACE)
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
                expires=time.time() + 300, replaces="default/web-a")))
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
