"""Smoke tests of the control-plane harness itself.

Each checks one piece of real cluster behaviour the product's end-to-end tests rely on: the
version built in, fake GPU nodes, the default scheduler, the controller manager plus the pod
completer (Deployments, PDBs, evictions), the bundled kubectl, and extra scheduler processes.
They run against the session's shared control plane, so every object they make is either in a
per-test namespace or deleted at the end of the module.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client import (
    AppsV1Api,
    CoreV1Api,
    PolicyV1Api,
    V1Container,
    V1Deployment,
    V1DeploymentSpec,
    V1Eviction,
    V1LabelSelector,
    V1ObjectMeta,
    V1Pod,
    V1PodDisruptionBudget,
    V1PodDisruptionBudgetSpec,
    V1PodSpec,
    V1PodTemplateSpec,
    V1ResourceRequirements,
)
from kubernetes.utils import parse_quantity as _parse_quantity

from devkit.build import BUILD_SCRIPT
from devkit.controlplane import ControlPlane
from devkit.procs import wait_until
from gpufrag.conventions import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY_MIB,
    LABEL_GPU_PRODUCT,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY_MIB,
    RESOURCE_GPU_MILLI,
)

pytestmark = pytest.mark.e2e

GO_MOD = BUILD_SCRIPT.parent / "go.mod"
CPU_NODE = "smoke-cpu-0"
GPU_NODE = "smoke-gpu-0"
A100 = "NVIDIA-A100-SXM4-80GB"
WAIT_S = 60.0

parse_quantity: Callable[[str], Decimal] = _parse_quantity  # the client leaves it untyped


def expected_kube_version() -> str:
    """The k8s.io/kubernetes version go.mod pins: what the API server must report."""
    match = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", GO_MOD.read_text(), re.MULTILINE)
    assert match, f"no k8s.io/kubernetes requirement in {GO_MOD}"
    return match.group(1)


def build_pod(name: str, *, cpu_milli: int = 100, gpus: int = 0,
              labels: Mapping[str, str] | None = None, node: str | None = None,
              scheduler_name: str | None = None) -> V1Pod:
    """A one-container pod; ``node`` pins it with a nodeSelector (the scheduler still binds)."""
    limits = {"cpu": f"{cpu_milli}m", "memory": "64Mi"}
    if gpus:
        limits[RESOURCE_GPU] = str(gpus)
    return V1Pod(
        metadata=V1ObjectMeta(name=name, labels=dict(labels or {})),
        spec=V1PodSpec(
            containers=[V1Container(name="main", image="registry.invalid/pause:1",
                                    resources=V1ResourceRequirements(limits=limits))],
            node_selector={"kubernetes.io/hostname": node} if node else None,
            scheduler_name=scheduler_name,
            termination_grace_period_seconds=30))


def wait_bound(core: CoreV1Api, namespace: str, name: str) -> V1Pod:
    def bound() -> V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.spec is not None and pod.spec.node_name else None

    return wait_until(bound, timeout_s=WAIT_S, what=f"pod {namespace}/{name} to be bound")


def wait_running(core: CoreV1Api, namespace: str, name: str) -> V1Pod:
    def running() -> V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status is not None and pod.status.phase == "Running" else None

    return wait_until(running, timeout_s=WAIT_S, what=f"pod {namespace}/{name} to run")


def wait_gone(core: CoreV1Api, namespace: str, name: str) -> None:
    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, namespace)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return True
            raise
        return False

    wait_until(gone, timeout_s=WAIT_S, what=f"pod {namespace}/{name} to be deleted")


def evict(core: CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod_eviction(name, namespace, V1Eviction(
        metadata=V1ObjectMeta(name=name, namespace=namespace)))


@pytest.fixture(scope="module")
def core(api_client: kubernetes.client.ApiClient) -> CoreV1Api:
    return CoreV1Api(api_client)


@pytest.fixture(scope="module")
def smoke_nodes(control_plane: ControlPlane, core: CoreV1Api) -> Iterator[None]:
    """A CPU-only node and a 4-GPU node, deleted after this module (the cluster is shared)."""
    control_plane.create_gpu_node(CPU_NODE, gpus=0, product="", gpu_memory_mib=0,
                                  cpu_milli=16_000, memory_mib=64 * 1024)
    control_plane.create_gpu_node(GPU_NODE, gpus=4, product=A100, gpu_memory_mib=81920,
                                  cpu_milli=64_000, memory_mib=512 * 1024,
                                  labels={"smoke": "true"})
    yield
    for name in (CPU_NODE, GPU_NODE):
        core.delete_node(name)


def test_api_server_reports_the_version_built_in(api_client: kubernetes.client.ApiClient) -> None:
    info = kubernetes.client.VersionApi(api_client).get_code()
    assert info.git_version == expected_kube_version()


def test_fake_gpu_node_has_gpu_resources_labels_and_is_ready(
        smoke_nodes: None, core: CoreV1Api) -> None:
    node = core.read_node(GPU_NODE)
    assert node.status is not None and node.metadata is not None and node.spec is not None
    # Compared as quantities: the API server canonicalises them ("4000" is stored as "4k").
    expected = {RESOURCE_GPU: 4, RESOURCE_GPU_MILLI: 4000, "cpu": 64, "pods": 110}
    for resources in (node.status.allocatable, node.status.capacity):
        assert resources is not None
        assert {k: parse_quantity(resources[k]) for k in expected} == expected
        # As on a real node: no device plugin advertises GPU memory.
        assert RESOURCE_GPU_MEMORY_MIB not in resources
    labels = node.metadata.labels or {}
    assert (labels[LABEL_GPU_PRODUCT], labels[LABEL_GPU_MEMORY_MIB], labels[LABEL_GPU_COUNT],
            labels["smoke"]) == (A100, "81920", "4", "true")
    ready = {c.type: c.status for c in node.status.conditions or []}
    assert ready.get("Ready") == "True"
    assert not node.spec.taints, "new nodes must not keep the not-ready taint"


def test_default_scheduler_binds_a_gpu_pod_to_a_node_with_gpus(
        smoke_nodes: None, core: CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, build_pod("one-gpu", gpus=1, labels={"smoke": "gpu"}))
    pod = wait_bound(core, namespace, "one-gpu")
    assert pod.spec is not None and pod.spec.node_name
    node = core.read_node(pod.spec.node_name)
    assert node.status is not None and node.status.allocatable is not None
    assert int(node.status.allocatable.get(RESOURCE_GPU, "0")) >= 1
    # The pod completer plays the kubelet: a bound pod becomes Running and Ready.
    running = wait_running(core, namespace, "one-gpu")
    assert running.status is not None
    assert {c.type: c.status for c in running.status.conditions or []}["Ready"] == "True"


def test_deployment_reaches_all_replicas_available(
        smoke_nodes: None, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    apps = AppsV1Api(api_client)
    labels = {"app": "smoke-web"}
    template = build_pod("unused", labels=labels, node=CPU_NODE)
    apps.create_namespaced_deployment(namespace, V1Deployment(
        metadata=V1ObjectMeta(name="smoke-web"),
        spec=V1DeploymentSpec(replicas=3, selector=V1LabelSelector(match_labels=labels),
                              template=V1PodTemplateSpec(metadata=V1ObjectMeta(labels=labels),
                                                         spec=template.spec))))

    def available() -> int | None:
        status = apps.read_namespaced_deployment_status("smoke-web", namespace).status
        return 3 if status is not None and status.available_replicas == 3 else None

    wait_until(available, timeout_s=WAIT_S, what="deployment smoke-web to have 3 available")


def test_eviction_succeeds_without_a_budget(
        smoke_nodes: None, core: CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, build_pod("free-to-go", node=CPU_NODE))
    wait_running(core, namespace, "free-to-go")
    evict(core, namespace, "free-to-go")
    # The eviction only sets a deletionTimestamp; the pod completer finishes the deletion.
    wait_gone(core, namespace, "free-to-go")


def test_pdb_without_headroom_blocks_an_eviction_with_429(
        smoke_nodes: None, api_client: kubernetes.client.ApiClient, core: CoreV1Api,
        namespace: str) -> None:
    labels = {"app": "guarded"}
    core.create_namespaced_pod(namespace, build_pod("guarded-0", labels=labels, node=CPU_NODE))
    wait_running(core, namespace, "guarded-0")
    policy = PolicyV1Api(api_client)
    policy.create_namespaced_pod_disruption_budget(namespace, V1PodDisruptionBudget(
        metadata=V1ObjectMeta(name="guarded"),
        spec=V1PodDisruptionBudgetSpec(min_available=1,
                                       selector=V1LabelSelector(match_labels=labels))))

    def settled() -> bool:
        pdb = policy.read_namespaced_pod_disruption_budget_status("guarded", namespace)
        status, meta = pdb.status, pdb.metadata
        return (status is not None and meta is not None
                and status.observed_generation == meta.generation
                and status.current_healthy == 1 and status.disruptions_allowed == 0)

    wait_until(settled, timeout_s=WAIT_S, what="the disruption controller to count guarded-0")
    with pytest.raises(kubernetes.client.ApiException) as refused:
        evict(core, namespace, "guarded-0")
    assert refused.value.status == 429
    assert core.read_namespaced_pod("guarded-0", namespace).metadata is not None


def test_kubectl_kustomize_and_server_side_dry_run(
        control_plane: ControlPlane, core: CoreV1Api, namespace: str, tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(textwrap.dedent("""\
        namePrefix: smoke-
        resources:
        - settings.yaml
        """))
    (tmp_path / "settings.yaml").write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: settings
        data:
          policy: fgd
        """))
    rendered = control_plane.kubectl("kustomize", str(tmp_path)).stdout
    assert "name: smoke-settings" in rendered

    applied = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                                    input_text=rendered)
    assert "configmap/smoke-settings created (server dry run)" in applied.stdout
    with pytest.raises(kubernetes.client.ApiException) as missing:
        core.read_namespaced_config_map("smoke-settings", namespace)
    assert missing.value.status == 404

    invalid = control_plane.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                                    input_text=rendered.replace("ConfigMap", "ConfigMapp"),
                                    check=False)
    assert invalid.returncode != 0, "the server, not the client, must reject an unknown kind"


def test_second_scheduler_binds_pods_that_name_it(
        smoke_nodes: None, control_plane: ControlPlane, api_client: kubernetes.client.ApiClient,
        core: CoreV1Api, namespace: str) -> None:
    scheduler = control_plane.start_scheduler("smoke-second", textwrap.dedent("""\
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: KubeSchedulerConfiguration
        profiles:
        - schedulerName: smoke-second-scheduler
        """))
    try:
        core.create_namespaced_pod(namespace, build_pod(
            "picky", gpus=1, node=GPU_NODE, scheduler_name="smoke-second-scheduler"))
        pod = wait_bound(core, namespace, "picky")
        assert pod.spec is not None and pod.spec.node_name == GPU_NODE

        events = kubernetes.client.EventsV1Api(api_client)

        def scheduled_by() -> str | None:
            for event in events.list_namespaced_event(namespace).items:
                regarding = event.regarding
                if (event.reason == "Scheduled" and regarding is not None
                        and regarding.name == "picky"):
                    return event.reporting_controller
            return None

        reporter = wait_until(scheduled_by, timeout_s=WAIT_S, what="the Scheduled event of picky")
        assert reporter == "smoke-second-scheduler"
    finally:
        control_plane.stop_scheduler("smoke-second")
    assert not scheduler.running()
