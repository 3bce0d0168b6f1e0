"""Monitoring and autoscaling as installed, against the real API server.

An overlay as an operator writes one (manifests/base plus the prometheus-operator,
grafana-dashboards, rightsizing and rightsizing-monitoring components) is applied for real,
server-side and with strict field validation, after the Prometheus Operator's and cert-manager's
own CRDs (fetched from their pinned Go modules: ``devkit.toolbuild.PROMETHEUS_OPERATOR_CRDS``,
``CERT_MANAGER_CRDS``). The controllers then create the workloads' pods, and each monitor's
selector is evaluated by the API server itself, with the label-selector list calls Prometheus's
service discovery makes: the PodMonitors must select the extender's, the agent's, the device
plugin's and the right-sizing webhook's pods on a port those pods declare (the webhook's over
HTTPS, verified with the CA of the Secret its pods mount), the ServiceMonitor the example
Service, whose selector selects the example's pods. The HPA is read back as stored, and the
pre-warm CronJobs' own command is run with their ServiceAccount's token: it may patch that one
HPA and nothing else, and the HPA controller then scales the Deployment out to the new
minimum ahead of the (scheduled) peak.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from devkit.controlplane import ControlPlane
from devkit.pki import kubeconfig_yaml
from devkit.procs import wait_until
from devkit.stack import delete_nodes

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
COMPONENTS = ("components/prometheus-operator", "components/grafana-dashboards",
              "components/rightsizing", "components/rightsizing-monitoring")
NS = "gpufrag-system"
GPU_NODE = "monitoring-gpu-0"
PREWARM_ACCOUNT = "resnet-serving-prewarm"
WAIT_S = 90.0

Obj = dict[str, Any]


@dataclass(frozen=True)
class Workload:
    """What a monitor is meant to select: a workload of the base and its pods' count."""

    kind: str
    name: str
    pods: int


# Monitor (kind, name) -> the workload it scrapes. The GPU node below is the one node the
# agent's and the device plugin's nodeSelectors match, so each DaemonSet has one pod.
EXPECTED = {
    ("PodMonitor", "gpufrag-extender"): Workload("Deployment", "gpufrag-scheduler", 1),
    ("PodMonitor", "gpufrag-agent"): Workload("DaemonSet", "gpufrag-agent", 1),
    ("PodMonitor", "gpufrag-device-plugin"): Workload("DaemonSet", "gpufrag-device-plugin", 1),
    ("PodMonitor", "gpufrag-admission"): Workload("Deployment", "gpufrag-admission", 2),
    ("ServiceMonitor", "resnet-serving"): Workload("Deployment", "resnet-serving", 2),
}


def render_installation(plane: ControlPlane, folder: Path) -> list[Obj]:
    """The base with the monitoring and right-sizing components, through an overlay in
    ``folder``."""
    def rel(path: str) -> str:  # kustomize refuses absolute paths
        return os.path.relpath(MANIFESTS / path, folder)

    (folder / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel("base")], "components": [rel(c) for c in COMPONENTS]}))
    out = plane.kubectl("kustomize", str(folder)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def selector_string(selector: Mapping[str, Any]) -> str:
    """A metav1.LabelSelector in the list call's labelSelector syntax."""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        terms.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])
    assert terms, f"an empty selector selects everything: {selector}"
    return ",".join(terms)


def owner_workload(apps: Any, pod: Any) -> tuple[str, str]:
    """(kind, name) of the Deployment or DaemonSet a pod belongs to."""
    (owner,) = pod.metadata.owner_references
    if owner.kind == "ReplicaSet":
        replica_set = apps.read_namespaced_replica_set(owner.name, pod.metadata.namespace)
        (owner,) = replica_set.metadata.owner_references
    return str(owner.kind), str(owner.name)


def creation_failures(core: Any) -> str:
    """Why the controllers could not create pods: the last FailedCreate event per workload."""
    events = core.list_namespaced_event(NS, field_selector="reason=FailedCreate").items
    last = {f"{e.involved_object.kind}/{e.involved_object.name}": e.message for e in events}
    return "\n".join(f"{owner}: {message}" for owner, message in sorted(last.items())) or "none"


@pytest.fixture(scope="module")
def installation(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
                 prometheus_operator_crds: list[Path], cert_manager_crds: list[Path]
                 ) -> Iterator[list[Obj]]:
    """The overlay applied for real, with every workload's pods created; removed after (the
    namespace stays: other modules use it)."""
    plane = control_plane
    crds = [arg for path in [*prometheus_operator_crds, *cert_manager_crds]
            for arg in ("-f", str(path))]
    plane.kubectl("apply", "--server-side", *crds)
    plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
    docs = render_installation(plane, tmp_path_factory.mktemp("overlay"))
    # A GPU node as the NVIDIA GPU Operator leaves it (GFD label, the "nvidia" RuntimeClass the
    # agent asks for), so the agent's DaemonSet has a node to run on.
    node_api: Any = kubernetes.client.NodeV1Api(plane.api_client())
    made_runtime_class = not any(rc.metadata.name == "nvidia"
                                 for rc in node_api.list_runtime_class().items)
    if made_runtime_class:
        node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                       "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    plane.create_gpu_node(GPU_NODE, 2, "A10", 23_028,
                          labels={"nvidia.com/gpu.present": "true"})
    manifest = yaml.safe_dump_all(docs)
    try:
        plane.kubectl("apply", "--server-side", "--validate=strict", "-f", "-",
                      input_text=manifest)
        core: Any = kubernetes.client.CoreV1Api(plane.api_client())
        apps: Any = kubernetes.client.AppsV1Api(plane.api_client())

        def created() -> bool:
            counts: dict[tuple[str, str], int] = {}
            for pod in core.list_namespaced_pod(NS).items:
                if pod.metadata.owner_references and pod.metadata.deletion_timestamp is None:
                    key = owner_workload(apps, pod)
                    counts[key] = counts.get(key, 0) + 1
            return all(counts.get((w.kind, w.name), 0) >= w.pods for w in EXPECTED.values())

        try:
            wait_until(created, timeout_s=WAIT_S, what="the workloads' pods")
        except TimeoutError as e:
            raise AssertionError(f"{e}; pods the controllers could not create:\n"
                                 f"{creation_failures(core)}") from None
        yield docs
    finally:
        installed = [d for d in docs if d["kind"] != "Namespace"]
        plane.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                      input_text=yaml.safe_dump_all(installed), check=False)
        plane.kubectl("delete", "--ignore-not-found", *crds, check=False)
        delete_nodes(plane, [GPU_NODE])
        if made_runtime_class:
            node_api.delete_runtime_class("nvidia")


def monitors(docs: Sequence[Obj]) -> list[Obj]:
    return [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")
            and d["kind"] in ("PodMonitor", "ServiceMonitor")]


def test_the_components_sit_with_the_workloads(installation: list[Obj]) -> None:
    ours = [d for d in installation if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in ours) == sorted(
        [*EXPECTED, ("PrometheusRule", "gpufrag")])
    for doc in ours:
        meta = doc["metadata"]
        assert meta["namespace"] == NS, meta
        # What a Prometheus's podMonitorSelector / ruleSelector can match on.
        assert meta["labels"]["app.kubernetes.io/part-of"] == "gpufrag", meta
        assert "namespaceSelector" not in doc["spec"], "select in the monitor's own namespace"


def desired_pods(apps: Any, workload: Workload) -> int:
    """How many pods ``workload`` wants now: a Deployment's replicas, a DaemonSet's nodes."""
    if workload.kind == "Deployment":
        return int(apps.read_namespaced_deployment(workload.name, NS).spec.replicas)
    return int(apps.read_namespaced_daemon_set(workload.name, NS).status.desired_number_scheduled)


@pytest.mark.parametrize(("kind", "name"), list(EXPECTED))
def test_each_monitor_selects_its_workload_on_a_declared_port(
        control_plane: ControlPlane, installation: list[Obj], kind: str, name: str) -> None:
    api = control_plane.api_client()
    core: Any = kubernetes.client.CoreV1Api(api)
    apps: Any = kubernetes.client.AppsV1Api(api)
    monitor = next(d for d in monitors(installation)
                   if (d["kind"], d["metadata"]["name"]) == (kind, name))
    expected = EXPECTED[(kind, name)]
    spec = monitor["spec"]
    if kind == "PodMonitor":
        selector = selector_string(spec["selector"])
        endpoints = spec["podMetricsEndpoints"]
        ports = [endpoint["port"] for endpoint in endpoints]
    else:
        services = core.list_namespaced_service(
            NS, label_selector=selector_string(spec["selector"])).items
        assert [s.metadata.name for s in services] == [expected.name]
        (service,) = services
        by_name = {p.name: p for p in service.spec.ports}
        endpoints = spec["endpoints"]
        assert {e["port"] for e in endpoints} <= set(by_name), (endpoints, by_name)
        ports = [by_name[e["port"]].target_port for e in endpoints]
        selector = ",".join(f"{k}={v}" for k, v in sorted(service.spec.selector.items()))

    def selected() -> list[Any] | None:
        """The live pods the monitor selects, once they are as many as the workload wants now
        (a Deployment's replicas follow its HPA: the prewarm test may have raised them)."""
        pods = core.list_namespaced_pod(NS, label_selector=selector).items
        live = [p for p in pods if p.metadata.deletion_timestamp is None]
        return live if len(live) == desired_pods(apps, expected) else None

    live = wait_until(selected, timeout_s=WAIT_S, what=f"the pods {kind} {name} selects")
    assert {owner_workload(apps, p) for p in live} == {(expected.kind, expected.name)}
    assert len(live) >= expected.pods
    assert all(e.get("path", "/metrics") == "/metrics" for e in endpoints)
    for pod in live:
        declared = {p.name: p.container_port for c in pod.spec.containers
                    for p in c.ports or [] if p.name}
        assert set(ports) <= set(declared), (ports, declared)
        if name == "gpufrag-admission":
            # HTTPS, verified: the CA of the Secret the webhook's pods serve from, for the
            # Service name its certificate holds (never insecureSkipVerify).
            (endpoint,) = endpoints
            tls = endpoint["tlsConfig"]
            assert endpoint["scheme"] == "https" and "insecureSkipVerify" not in tls
            mounted = {v.secret.secret_name for v in pod.spec.volumes if v.secret}
            assert tls["ca"]["secret"]["name"] in mounted and tls["ca"]["secret"]["key"] == "ca.crt"
            certificate = next(d for d in installation if d["kind"] == "Certificate")
            assert certificate["spec"]["secretName"] == tls["ca"]["secret"]["name"]
            assert tls["serverName"] in certificate["spec"]["dnsNames"]
        if name == "gpufrag-extender":
            # The probe listener (server.health_port), never the verbs' port (8888, loopback).
            (extender,) = [c for c in pod.spec.containers if c.name == "extender"]
            assert [declared[p] for p in ports] == [8889]
            assert "--set=server.health_port=8889" in extender.args


def test_rules_and_dashboards_are_stored(control_plane: ControlPlane,
                                         installation: list[Obj]) -> None:
    custom: Any = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    rule = custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", NS,
                                               "prometheusrules", "gpufrag")
    stored = {r.get("record") or r.get("alert") for g in rule["spec"]["groups"]
              for r in g["rules"]}
    rendered = next(d for d in installation if d["kind"] == "PrometheusRule")
    assert stored == {r.get("record") or r.get("alert") for g in rendered["spec"]["groups"]
                      for r in g["rules"]}
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    dashboards = core.read_namespaced_config_map("gpufrag-dashboards", NS)
    assert dashboards.metadata.labels["grafana_dashboard"] == "1"
    uids = {json.loads(text)["uid"] for text in dashboards.data.values()}
    assert uids == {"gpufrag-extender", "gpufrag-defrag", "gpufrag-agent", "gpufrag-serving"}


def test_the_hpa_is_stored_as_written(control_plane: ControlPlane,
                                      installation: list[Obj]) -> None:
    # Read back as stored: a field the API server does not serve (a gated one) is dropped.
    hpa = json.loads(control_plane.kubectl("get", "horizontalpodautoscaler", "resnet-serving",
                                           f"--namespace={NS}", "--output=json").stdout)
    assert hpa["spec"]["behavior"]["scaleUp"]["tolerance"] == "0"
    assert {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"]
            for m in hpa["spec"]["metrics"]} == {
        "gpufrag_serving_queue_depth": "50",
        "gpufrag_serving_gpu_utilization_avg5m_sustained_2m": "800m",
        "gpufrag_serving_request_p99_seconds_sustained_1m": "200m"}


@pytest.fixture
def prewarm_kubeconfig(control_plane: ControlPlane, installation: list[Obj],
                       tmp_path: Path) -> Path:
    core: Any = kubernetes.client.CoreV1Api(control_plane.api_client())
    token = wait_until(lambda: core.create_namespaced_service_account_token(
        PREWARM_ACCOUNT, NS, {"spec": {"expirationSeconds": 3600}}).status.token,
        timeout_s=30, what=f"a token for {PREWARM_ACCOUNT}")
    ca = Path(control_plane.api_client().configuration.ssl_ca_cert).read_bytes()
    path = tmp_path / "prewarm.kubeconfig"
    path.write_text(kubeconfig_yaml(control_plane.server, ca, token))
    return path


def _prewarm_commands(docs: Sequence[Obj]) -> dict[str, list[str]]:
    out = {}
    for doc in docs:
        if doc["kind"] == "CronJob" and doc["metadata"]["name"].startswith(PREWARM_ACCOUNT):
            pod = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
            assert pod["serviceAccountName"] == PREWARM_ACCOUNT
            (container,) = pod["containers"]
            assert container["command"] == ["/bin/kubectl"]
            out[doc["metadata"]["name"]] = container["args"]
    return out


def test_prewarm_jobs_patch_their_hpa_and_nothing_else(
        control_plane: ControlPlane, installation: list[Obj], prewarm_kubeconfig: Path) -> None:
    commands = _prewarm_commands(installation)
    assert set(commands) == {PREWARM_ACCOUNT, f"{PREWARM_ACCOUNT}-end"}
    api = control_plane.api_client()
    autoscaling: Any = kubernetes.client.AutoscalingV2Api(api)
    apps: Any = kubernetes.client.AppsV1Api(api)

    def as_job(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        # What the Job's container runs, with the Job's identity (in the pod the namespace is
        # the ServiceAccount's; here it is given).
        return subprocess.run([str(control_plane.binary), "kubectl",
                               f"--kubeconfig={prewarm_kubeconfig}", f"--namespace={NS}", *args],
                              capture_output=True, text=True, timeout=60, check=False)

    def run_as_job(args: Sequence[str]) -> None:
        result = as_job(args)
        assert result.returncode == 0, result.stderr

    run_as_job(commands[PREWARM_ACCOUNT])
    assert autoscaling.read_namespaced_horizontal_pod_autoscaler(
        "resnet-serving", NS).spec.min_replicas == 8
    # The HPA controller raises the Deployment to the new minimum at once (metrics or not):
    # the replicas are placed and load their model before the peak.
    wait_until(lambda: apps.read_namespaced_deployment("resnet-serving", NS).spec.replicas == 8,
               timeout_s=WAIT_S, what="the HPA to scale resnet-serving out to 8")

    run_as_job(commands[f"{PREWARM_ACCOUNT}-end"])
    hpa = autoscaling.read_namespaced_horizontal_pod_autoscaler("resnet-serving", NS)
    base_hpa = next(d for d in installation if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa.spec.min_replicas == base_hpa["spec"]["minReplicas"] == 2

    for forbidden in (
            ["patch", "deployment", "resnet-serving", "--type=merge",
             '--patch={"spec":{"replicas":20}}'],
            ["get", "horizontalpodautoscaler", "some-other-hpa"],
            ["get", "pods"],
            ["delete", "horizontalpodautoscaler", "resnet-serving"]):
        result = as_job(forbidden)
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), (forbidden,
                                                                                 result.stderr)
