"""manifests/ against the real API server and the real kube-scheduler.

Every overlay renders with kubectl's kustomize and is accepted by a server-side dry run; the
KubeSchedulerConfiguration each overlay ships is loaded by a real kube-scheduler process.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from devkit.controlplane import ControlPlane
from devkit.extender import gpufrag_scheduler_config
from gpufrag.conventions import MANAGED_RESOURCES

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
OVERLAYS = ["base", "overlays/dev", "overlays/production"]


def render(plane: ControlPlane, path: str) -> list[dict[str, object]]:
    out = plane.kubectl("kustomize", str(MANIFESTS / path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def system_namespace(control_plane: ControlPlane) -> str:
    # A dry-run Namespace is not persisted, so namespaced objects need the real one (and one
    # not being deleted by another module's clean-up).
    return control_plane.ensure_namespace("gpufrag-system")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_is_accepted_by_the_api_server(control_plane: ControlPlane,
                                               system_namespace: str, overlay: str) -> None:
    docs = render(control_plane, overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "CronJob", "DaemonSet", "HorizontalPodAutoscaler",
            "PodDisruptionBudget", "ClusterRole", "ServiceAccount", "ConfigMap"} <= kinds
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-",
                                   input_text=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


def test_the_dra_component_is_accepted_by_the_api_server(
        control_plane: ControlPlane, system_namespace: str, tmp_path: Path) -> None:
    """The base with components/dra, as an overlay adds it: the resource.k8s.io/v1
    DeviceClasses (one with an extended resource, KEP-5004) and the driver's DaemonSet and RBAC
    pass the 1.36 API server's validation."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS / "base", tmp_path)],
        "components": [os.path.relpath(MANIFESTS / "components" / "dra", tmp_path)]}))
    docs = render(control_plane, str(tmp_path))
    assert {("DeviceClass", "gpu.gpufrag.io"), ("DeviceClass", "whole.gpu.gpufrag.io"),
            ("DaemonSet", "gpufrag-dra-plugin"), ("ClusterRole", "gpufrag-dra-plugin")} <= {
        (d["kind"], d["metadata"]["name"]) for d in docs}  # type: ignore[index]
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-",
                                   input_text=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


def test_the_dra_claims_component_is_accepted_by_the_api_server(
        control_plane: ControlPlane, system_namespace: str) -> None:
    """The conversion's webhook rule (sideEffects NoneOnDryRun, failurePolicy Fail, a
    namespace selector on the delivery label) and its RBAC pass the API server's validation."""
    docs = render(control_plane, "components/dra-claims")
    assert {("MutatingWebhookConfiguration", "gpufrag-dra-claims"),
            ("ClusterRole", "gpufrag-admission-dra-claims")} <= {
        (d["kind"], d["metadata"]["name"]) for d in docs}  # type: ignore[index]
    result = control_plane.kubectl("apply", "--dry-run=server", "-f", "-",
                                   input_text=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


# The device plugin connects to the kubelet's socket, which the kubelet creates root-only
# (directory 0750, socket 0755; connecting needs write permission): docs/deviceplugin.md.
RUNS_AS_ROOT = {"gpufrag-device-plugin"}


def test_every_container_is_locked_down(control_plane: ControlPlane) -> None:
    for doc in render(control_plane, "overlays/production"):
        spec = doc.get("spec") or {}
        template = (spec.get("jobTemplate", {}).get("spec", spec)  # type: ignore[union-attr]
                    .get("template"))
        if not template:
            continue
        pod = template["spec"]
        if doc["metadata"]["name"] in RUNS_AS_ROOT:  # type: ignore[index]
            # Root, but with nothing else: no capability, no escalation, default seccomp.
            assert pod["securityContext"]["runAsUser"] == 0
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        else:
            assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
            assert not sc.get("allowPrivilegeEscalation", True)
            assert c["resources"]["requests"] and c["resources"]["limits"]
            if doc["kind"] != "CronJob":  # a Job runs to completion: nothing to probe
                assert "readinessProbe" in c and ("livenessProbe" in c or "startupProbe" in c)


def test_prometheus_operator_component_renders(control_plane: ControlPlane) -> None:
    # Rendered only: the harness has no Prometheus Operator CRDs for a dry run to check against.
    kinds = sorted(d["kind"] for d in render(control_plane, "components/prometheus-operator"))
    assert kinds == ["PodMonitor", "PodMonitor", "PodMonitor", "PrometheusRule",
                     "ServiceMonitor"]
    # The webhook's monitor, for overlays with the right-sizing component too.
    joint = render(control_plane, "components/rightsizing-monitoring")
    assert [(d["kind"], d["metadata"]["name"]) for d in joint] == [  # type: ignore[index]
        ("PodMonitor", "gpufrag-admission")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scheduler_configuration_loads_in_kube_scheduler(control_plane: ControlPlane,
                                                         overlay: str) -> None:
    config = next(d for d in render(control_plane, overlay) if d["kind"] == "ConfigMap" and
                  d["metadata"]["name"] == "gpufrag-scheduler-config")  # type: ignore[index]
    text = config["data"]["config.yaml"]  # type: ignore[index]
    name = f"manifest-{overlay.replace('/', '-')}"
    control_plane.start_scheduler(name, text)  # returns once /readyz answers: config accepted
    control_plane.stop_scheduler(name)


def _managed(config_text: str) -> list[dict[str, bool]]:
    config = yaml.safe_load(config_text)
    return [{r["name"]: r["ignoredByScheduler"] for r in extender["managedResources"]}
            for extender in config["extenders"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_scheduler_configuration_names_the_resources_the_extender_manages(
        control_plane: ControlPlane, overlay: str) -> None:
    # A resource missing here is counted by kube-scheduler itself: a memory-share pod, on nodes
    # that advertise no GPU memory, would be failed before the extender is asked.
    config = next(d for d in render(control_plane, overlay) if d["kind"] == "ConfigMap" and
                  d["metadata"]["name"] == "gpufrag-scheduler-config")  # type: ignore[index]
    assert _managed(config["data"]["config.yaml"]) == [MANAGED_RESOURCES]  # type: ignore[index]
    assert _managed(gpufrag_scheduler_config("http://127.0.0.1:1")) == [MANAGED_RESOURCES]
