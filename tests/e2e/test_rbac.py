"""RBAC from manifests/: each component, run with exactly its ServiceAccount's permissions (a
real token from the TokenRequest API), does its job; calls outside its job are forbidden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes
import pytest
import yaml

from defrag.controller.cli import main as defrag_main
from devkit.controlplane import ControlPlane
from devkit.pki import kubeconfig_yaml
from devkit.procs import wait_until
from devkit.stack import delete_nodes, gpu_pod
from gpufrag import conventions as cv
from node.agent.cgroup import KubePodLister
from node.agent.publish import KubeClusterWriter
from node.deviceplugin.config import ANNOTATION_GPU_ALLOCATED
from node.deviceplugin.matching import pod_ask
from node.deviceplugin.trust import KubeRecordKeys
from scheduler.extender.config import config_from_mapping
from scheduler.extender.runtime import cluster_runtime
from scheduler.kube.recordkeys import ensure_signer
from tests.e2e.test_manifests import render

NS = "gpufrag-system"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
              "RoleBinding"}
NODE = "rbac-node-0"

Clients = Callable[[str], kubernetes.client.ApiClient]


def token_client(control_plane: ControlPlane, account: str, path: Path,
                 bound_to: dict[str, str] | None = None) -> kubernetes.client.ApiClient:
    """A client authenticated as ServiceAccount ``account`` of gpufrag-system, with a token from
    the TokenRequest API (bound to the object ``bound_to`` names, e.g. a Pod, where given);
    its kubeconfig is written to ``path`` once and read back after."""
    if not path.exists():
        core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())  # plain-dict bodies
        spec: dict[str, object] = {"expirationSeconds": 3600}
        if bound_to is not None:
            spec["boundObjectRef"] = bound_to
        token = wait_until(lambda: core.create_namespaced_service_account_token(
            account, NS, {"spec": spec}).status.token, timeout_s=30,
            what=f"a token for {account}")
        ca = Path(control_plane.api_client().configuration.ssl_ca_cert).read_bytes()
        path.write_text(kubeconfig_yaml(control_plane.server, ca, token))
    api: Any = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(path))
    api.kubeconfig_path = path  # for components that take --kubeconfig
    return cast(kubernetes.client.ApiClient, api)


@pytest.fixture(scope="module")
def as_service_account(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[Clients]:
    """Apply the manifests' RBAC for real, and hand out clients authenticated as each SA."""
    docs = [d for d in render(control_plane, "base") if d["kind"] in RBAC_KINDS or
            d["metadata"]["name"] == cv.HINTS_CONFIGMAP]  # type: ignore[index]
    control_plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(docs))
    control_plane.create_gpu_node(NODE, 2, "A10", 23_028)
    folder = tmp_path_factory.mktemp("sa")

    def client(account: str) -> kubernetes.client.ApiClient:
        return token_client(control_plane, account, folder / f"{account}.kubeconfig")

    yield client
    delete_nodes(control_plane, [NODE])


def _forbidden(call: Callable[[], object]) -> bool:
    try:
        call()
    except kubernetes.client.ApiException as e:
        return e.status == 403
    return False


def _absent_ok(call: Callable[[], object]) -> None:
    """``call``, a 404 (the object is not there, but the call was allowed) taken as done."""
    try:
        call()
    except kubernetes.client.ApiException as e:
        if e.status != 404:
            raise


def test_extender_watches_and_binds_with_its_service_account(
        control_plane: ControlPlane, as_service_account: Clients, namespace: str) -> None:
    # The extender binds only its own scheduler's pods; "nobody" keeps kube-scheduler away.
    config = config_from_mapping({"maintenance_interval_s": 0.2, "watch": {"timeout_s": 5},
                                  "names": {"scheduler_name": "nobody"}})
    runtime = cluster_runtime(lambda: as_service_account("gpufrag-scheduler"), config)
    runtime.start()
    admin = kubernetes.client.CoreV1Api(control_plane.api_client())
    try:
        wait_until(lambda: runtime.extender.ready or None, timeout_s=60,
                   what="the extender to list and watch as gpufrag-scheduler")
        admin.create_namespaced_pod(namespace, gpu_pod("p", milli=300, scheduler="nobody"))
        uid = admin.read_namespaced_pod("p", namespace).metadata.uid
        wait_until(lambda: runtime.cache.pods.get(f"{namespace}/p"), timeout_s=30,
                   what="the watch to see the pod")
        # The record key: made, kept in its Secret and published with the SA's rights only
        # (a second start reads the same key back).
        signer = ensure_signer(as_service_account("gpufrag-scheduler"), config.names)
        assert ensure_signer(as_service_account("gpufrag-scheduler"),
                             config.names).key_id == signer.key_id
        runtime.extender.bind.signer = signer
        outcome = runtime.extender.bind(namespace, "p", uid, NODE)
        pod = admin.read_namespaced_pod("p", namespace)
        assert pod.spec.node_name == NODE
        annotations = pod.metadata.annotations
        assert annotations[cv.ANNOTATION_GPU_INDICES] == str(outcome.gpus[0])
        # ... and the device plugin, with its own SA's rights, accepts exactly that record.
        keys = KubeRecordKeys.from_api(as_service_account("gpufrag-device-plugin"),
                                       cv.DEFAULT_NAMES)
        asked = pod_ask(admin.api_client.sanitize_for_serialization(pod), cv.DEFAULT_NAMES,
                        annotation_allocated=ANNOTATION_GPU_ALLOCATED)
        assert asked is not None
        keys.refresh(asked)
        assert keys.problem(asked) == "", keys.last_error
    finally:
        runtime.stop()
    plugin = kubernetes.client.CoreV1Api(as_service_account("gpufrag-device-plugin"))
    assert _forbidden(lambda: plugin.read_namespaced_secret(cv.RECORD_KEY_SECRET, NS))
    core = kubernetes.client.CoreV1Api(as_service_account("gpufrag-scheduler"))
    # (Deleting pods is allowed: kube-scheduler's own role needs it for preemption.)
    assert _forbidden(lambda: core.create_namespaced_pod_eviction("p", namespace, {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}))
    assert _forbidden(lambda: core.list_secret_for_all_namespaces())
    assert _forbidden(lambda: core.patch_node(NODE, {"metadata": {"labels": {"x": "y"}}}))
    # The GPU annotation travels in the Binding: no right to patch pods is needed, none given.
    assert _forbidden(lambda: core.patch_namespaced_pod("p", namespace, {
        "metadata": {"labels": {"x": "y"}}}))


def test_defrag_cycle_runs_with_its_service_account(
        control_plane: ControlPlane, as_service_account: Clients, namespace: str) -> None:
    client = as_service_account("gpufrag-defrag")
    kubeconfig = str(client.kubeconfig_path)
    assert defrag_main(["--kubeconfig", kubeconfig, "--dry-run", "--output", "json"]) == 0

    admin = kubernetes.client.CoreV1Api(control_plane.api_client())
    admin.create_namespaced_pod(namespace, gpu_pod("victim", milli=300, scheduler="nobody"))
    core = kubernetes.client.CoreV1Api(client)
    core.create_namespaced_pod_eviction("victim", namespace, {
        "apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": "victim", "namespace": namespace}})
    core.patch_namespaced_config_map(cv.HINTS_CONFIGMAP, NS, {"data": {"uid-1": "[]"}})
    assert _forbidden(lambda: core.delete_namespaced_pod("other", namespace))
    assert _forbidden(lambda: core.list_secret_for_all_namespaces())
    assert _forbidden(lambda: core.create_namespaced_config_map(
        NS, {"metadata": {"name": "not-hints"}}))


def test_extender_in_dra_mode_lists_claims_and_slices_with_its_service_account(
        as_service_account: Clients) -> None:
    """DRA mode turns ready under the SA's rights. (The SA is also bound to kube-scheduler's
    own role, which reads claims and slices for its allocator too: this checks the extender
    can run in DRA mode as installed, not that its own rule alone grants it.)"""
    config = config_from_mapping({"maintenance_interval_s": 0.2, "watch": {"timeout_s": 5},
                                  "names": {"scheduler_name": "nobody"},
                                  "dra": {"enabled": True}})
    runtime = cluster_runtime(lambda: as_service_account("gpufrag-scheduler"), config)
    runtime.start()
    try:
        # Ready only once every watch, the ResourceClaims' and ResourceSlices' too, has listed.
        wait_until(lambda: runtime.extender.ready or None, timeout_s=60,
                   what="the extender to list claims and slices as gpufrag-scheduler")
        assert runtime.cache.claims_synced and runtime.cache.slices_synced
    finally:
        runtime.stop()


def test_agent_publishes_with_its_service_account(
        control_plane: ControlPlane, as_service_account: Clients) -> None:
    client = as_service_account("gpufrag-agent")
    KubeClusterWriter(client, node_name=NODE).patch_node_annotation(
        NODE, cv.ANNOTATION_GPU_USAGE, "{}")
    assert KubePodLister(client, NODE).list_pods() is not None
    # A DRA pod's share is its claim's allocation: get, and no more, on resourceclaims.
    resource = kubernetes.client.ResourceV1Api(client)
    assert not _forbidden(lambda: _absent_ok(
        lambda: resource.read_namespaced_resource_claim("none", "default")))
    assert _forbidden(lambda: resource.list_resource_claim_for_all_namespaces())
    core = kubernetes.client.CoreV1Api(client)
    assert _forbidden(lambda: core.delete_node(NODE))
    assert _forbidden(lambda: core.patch_namespaced_pod("x", "default", {"metadata": {}}))
    assert _forbidden(lambda: core.list_secret_for_all_namespaces())

