"""How the DRA driver is installed (manifests/components/dra, helm dra.enabled; docs/dra.md,
"Install"): kustomize and the chart give the same objects, the driver and the device plugin
split the GPU nodes by one node label (so the move to DRA goes node by node), the DaemonSet
mounts exactly the directories the driver's flags name, and its RBAC grants exactly the API
calls node/dra/kube.py makes. The conversion of GPU asks into claims
(manifests/components/dra-claims, helm dra.enabled with rightsizing.enabled): its webhook
rule takes exactly the namespaces the right-sizing rule leaves, by the namespace label, and
its RBAC grants exactly the calls defrag/admission/templates.py makes. The API server's verdict
on the objects: tests/e2e/test_manifests.py.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from defrag.admission import templates as admission_templates
from defrag.admission.review import AdmissionMetrics
from defrag.admission.server import create_app
from devkit import manifests
from gpufrag.conventions import DEFAULT_NAMES, DELIVERY_DRA
from node.dra import kube as dra_kube
from node.dra.api import PLUGINS_DIR, PLUGINS_REGISTRY_DIR
from node.dra.config import DEFAULT_CDI_DIR, DEFAULT_METRICS_PORT, DRIVER_NAME
from scheduler.core.mig import all_profile_names
from scheduler.kube.claims import DEVICE_CLASSES, gpu_selector, mig_class_name, mig_selector
from tests.e2e.test_helm import BASE, find, helm_template, same_objects

DRA_VALUES = manifests.set_flags(manifests.PARTS["dra"])
CLAIMS_VALUES = manifests.set_flags(manifests.PARTS["dra-claims"])
DELIVERY_LABEL = DEFAULT_NAMES.label_delivery
DRA_NODES = {DELIVERY_LABEL: DELIVERY_DRA}
# The typed client's method name prefixes -> the RBAC verb each call needs.
CLIENT_VERBS = {"read": "get", "list": "list", "create": "create", "replace": "update",
                "delete": "delete", "patch": "patch", "watch": "watch"}
# The typed client's object names (after the verb, namespaced_ dropped) -> (group, resource).
CLIENT_RESOURCES = {"node": ("", "nodes"),
                    "resource_slice": ("resource.k8s.io", "resourceslices"),
                    "resource_claim": ("resource.k8s.io", "resourceclaims"),
                    "resource_claim_template": ("resource.k8s.io", "resourceclaimtemplates")}


def with_dra(kubectl: list[str], tmp_path: Path, *components: str) -> list[dict[str, Any]]:
    """The base with ``components`` (components/dra by default), as an overlay names them
    (by relative path)."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(manifests.BASE_DIR, tmp_path)],
        "components": [os.path.relpath(manifests.COMPONENTS_DIR / name, tmp_path)
                       for name in components or ("dra",)]}))
    result = subprocess.run([*kubectl, "kustomize", str(tmp_path)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def found(docs: list[dict[str, object]], kind: str, name: str) -> Any:
    """The object ``kind``/``name`` of ``docs``, typed for reading nested fields."""
    return find(docs, kind, name)


def pod_spec(docs: list[dict[str, object]], name: str) -> Any:
    return found(docs, "DaemonSet", name)["spec"]["template"]["spec"]


def calls_of_the_driver(source: str = dra_kube.__file__) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every Kubernetes client call in ``source`` (node/dra/kube.py
    by default), read from it: a call added there without its grant fails the RBAC test."""
    tree = ast.parse(Path(source).read_text())
    calls = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        verb, _, rest = node.func.attr.partition("_")
        rest = rest.removeprefix("namespaced_")
        if verb in CLIENT_VERBS and rest in CLIENT_RESOURCES:
            calls.add((*CLIENT_RESOURCES[rest], CLIENT_VERBS[verb]))
    return calls


def test_the_component_on_the_base_is_what_the_chart_renders_with_dra(
        helm: Path, kubectl: list[str], tmp_path: Path) -> None:
    """The component's hand-written device-plugin patch is the chart's affinity, and its
    resources are the chart's dra templates: one install, two ways."""
    same_objects(helm_template(helm, *BASE, *DRA_VALUES), with_dra(kubectl, tmp_path))


def test_the_driver_and_the_device_plugin_split_the_gpu_nodes_by_one_label(
        helm: Path) -> None:
    docs = helm_template(helm, *BASE, *DRA_VALUES)
    dra = pod_spec(docs, "gpufrag-dra-plugin")
    device_plugin = pod_spec(docs, "gpufrag-device-plugin")
    assert dra["nodeSelector"] == {**device_plugin["nodeSelector"], **DRA_NODES}
    (term,) = (device_plugin["affinity"]["nodeAffinity"]
               ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])
    assert term == {"matchExpressions": [
        {"key": DELIVERY_LABEL, "operator": "NotIn", "values": [DRA_NODES[DELIVERY_LABEL]]}]}


def test_without_dra_nothing_of_it_renders_and_the_device_plugin_is_unchanged(
        helm: Path) -> None:
    docs = helm_template(helm, *BASE)
    assert not [d for d in docs if d["kind"] == "DeviceClass"
                or "dra" in yaml.safe_dump(d["metadata"])]
    assert "affinity" not in pod_spec(docs, "gpufrag-device-plugin")


def test_a_device_plugin_node_affinity_is_refused_with_dra_naming_the_field(
        helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "template", "gpufrag", str(manifests.CHART_DIR), *DRA_VALUES,
         "--set-json", 'devicePlugin.affinity={"nodeAffinity":{"requiredDuringScheduling'
         'IgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"a",'
         '"operator":"Exists"}]}]}}}'], capture_output=True, text=True, timeout=120,
        check=False)
    assert result.returncode != 0
    assert "devicePlugin.affinity.nodeAffinity" in result.stderr


def test_the_daemonset_mounts_what_the_drivers_flags_name(helm: Path) -> None:
    spec = pod_spec(helm_template(helm, *BASE, *DRA_VALUES), "gpufrag-dra-plugin")
    (container,) = spec["containers"]
    assert container["args"] == [
        "dra-plugin", f"--registry-dir={PLUGINS_REGISTRY_DIR}", f"--plugins-dir={PLUGINS_DIR}",
        f"--cdi-dir={DEFAULT_CDI_DIR}", f"--metrics-port={DEFAULT_METRICS_PORT}"]
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounted = {host[m["name"]]: m["mountPath"] for m in container["volumeMounts"]}
    # Each host directory at the same path inside: the kubelet hands out the host's paths.
    assert mounted == {p: p for p in (PLUGINS_REGISTRY_DIR, f"{PLUGINS_DIR}/{DRIVER_NAME}",
                                      DEFAULT_CDI_DIR)}
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_the_rbac_grants_exactly_the_calls_the_driver_makes(helm: Path) -> None:
    docs = helm_template(helm, *BASE, *DRA_VALUES)
    role = found(docs, "ClusterRole", "gpufrag-dra-plugin")
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    made = calls_of_the_driver()
    assert {("", "nodes", "get"), ("resource.k8s.io", "resourceclaims", "get")} <= made
    assert granted == made
    binding = found(docs, "ClusterRoleBinding", "gpufrag-dra-plugin")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpufrag-dra-plugin",
                                    "namespace": manifests.BASE_NAMESPACE}]
    assert pod_spec(docs, "gpufrag-dra-plugin")["serviceAccountName"] == "gpufrag-dra-plugin"


def test_the_device_classes_select_the_driver_and_map_the_whole_gpu_resource(
        helm: Path) -> None:
    docs: list[Any] = helm_template(helm, *BASE, *DRA_VALUES)
    classes = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    selector = [{"cel": {"expression": gpu_selector(DRIVER_NAME)}}]
    assert {name: classes[name] for name in DEVICE_CLASSES} == {
        DRIVER_NAME: {"selectors": selector},
        f"whole.{DRIVER_NAME}": {"selectors": selector,
                                 "extendedResourceName": "gpufrag.io/dra-gpu"}}
    # One class per profile name of the MIG table, selecting the driver's partitions of it.
    assert {name: spec for name, spec in classes.items() if name not in DEVICE_CLASSES} == {
        mig_class_name(profile): {"selectors": [{"cel": {"expression": mig_selector(profile)}}]}
        for profile in all_profile_names()}


def granted(role: Any) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def webhooks(docs: list[Any]) -> dict[str, Any]:
    return {w["name"]: w for d in docs if d["kind"] == "MutatingWebhookConfiguration"
            for w in d["webhooks"]}


def delivery(webhook: Any) -> Any:
    (term,) = [e for e in webhook["namespaceSelector"]["matchExpressions"]
               if e["key"] == DELIVERY_LABEL]
    return term


def test_the_conversion_renders_only_beside_the_webhook_it_runs_in(helm: Path) -> None:
    """Without the right-sizing webhook's Deployment nothing would answer /mutate-dra, and with
    failurePolicy Fail every pod of a labelled namespace would be refused."""
    assert "claims.gpufrag.io" not in webhooks(helm_template(helm, *BASE, *DRA_VALUES))
    assert "claims.gpufrag.io" not in webhooks(helm_template(
        helm, *BASE, "--set", "rightsizing.enabled=true"))
    assert "claims.gpufrag.io" in webhooks(helm_template(helm, *BASE, *CLAIMS_VALUES))


def test_labelled_namespaces_go_to_the_conversion_and_every_other_one_to_right_sizing(
        helm: Path) -> None:
    docs = helm_template(helm, *BASE, *CLAIMS_VALUES)
    hooks = webhooks(docs)
    claims, rightsizing = hooks["claims.gpufrag.io"], hooks["rightsizing.gpufrag.io"]
    assert delivery(claims) == {"key": DELIVERY_LABEL, "operator": "In",
                                "values": [DELIVERY_DRA]}
    assert delivery(rightsizing) == {**delivery(claims), "operator": "NotIn"}
    assert claims["clientConfig"]["service"] == {
        **rightsizing["clientConfig"]["service"], "path": "/mutate-dra"}
    app = create_app(lambda _ns, _refs: None, DEFAULT_NAMES, AdmissionMetrics())
    routes = {rule.rule for rule in app.url_map.iter_rules()}
    assert {"/mutate", "/mutate-dra"} <= routes
    # Refused rather than admitted unconverted; templates made only on real creations.
    assert (claims["failurePolicy"], claims["sideEffects"]) == ("Fail", "NoneOnDryRun")
    assert claims["timeoutSeconds"] == rightsizing["timeoutSeconds"]


def test_the_conversions_rbac_grants_exactly_the_calls_the_webhook_makes(helm: Path) -> None:
    docs = helm_template(helm, *BASE, *CLAIMS_VALUES)
    role = found(docs, "ClusterRole", "gpufrag-admission-dra-claims")
    made = calls_of_the_driver(admission_templates.__file__)
    assert made == {("resource.k8s.io", "resourceclaimtemplates", "get"),
                    ("resource.k8s.io", "resourceclaimtemplates", "create")}
    assert granted(role) == made
    binding = found(docs, "ClusterRoleBinding", "gpufrag-admission-dra-claims")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gpufrag-admission",
                                    "namespace": manifests.BASE_NAMESPACE}]


def test_the_components_on_the_base_are_what_the_chart_renders_with_the_conversion(
        helm: Path, kubectl: list[str], tmp_path: Path) -> None:
    same_objects(helm_template(helm, *BASE, *CLAIMS_VALUES),
                 with_dra(kubectl, tmp_path, "dra", "rightsizing", "dra-claims"))
