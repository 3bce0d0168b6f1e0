"""charts/gpufrag against the kustomize base, helm itself and the real API server.

The chart is the source of manifests/: ``devkit/manifests.py`` renders the kustomize base's and
the components' resources from it with ``helm template``. These tests hold both to that: the
committed manifests are what the chart renders today (so a changed template fails here until
they are rendered again); kustomize over them -- with the base's transformers and image list,
the overlays' and the patch component's patches, none of which Helm sees -- gives what
``helm template`` gives with the matching values: the base's layout
(``manifests.BASE_LAYOUT``) the base's objects (but for Helm's standard labels and keep policy),
the production values the production overlay's, each optional part its component's; default
values render the base in the release's namespace, without the Namespace and the example.
``helm install R charts/gpufrag -n NS --create-namespace``, as a user types it, ends deployed on
a real API server with every namespaced object in NS, with and without the example. ``helm lint
--strict`` passes, the values reach the objects they name, bad values are refused naming the
field, a second release shares no cluster-wide name with the first, every rendered object is
accepted by a server-side dry run, and the hooks' own commands do what they claim against a real
API server (``helm test``'s against a real extender too). Install, upgrade, a second release and
uninstall run on an API server of their own, with the Prometheus Operator's and cert-manager's
own CRDs (fetched from their pinned Go modules); ``helm test`` and the CRD upgrade hook on the
real node: tests/e2e/node/test_helm_release.py. helm is built from its Go module
(``devkit/tools/helm``).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import kubernetes
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devkit import manifests
from devkit.controlplane import ControlPlane
from devkit.extender import ExtenderProcess
from devkit.imageref import has_registry_host
from devkit.procs import free_port
from scheduler.extender.config import ExtenderConfig, config_from_mapping
from scheduler.kube import reservations as rsv
from scheduler.kube.reservations import Reservation

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpufrag"
MANIFESTS = REPO / "manifests"
# Everything kustomize renders here: the base, each overlay, each component.
KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/production",
                  *sorted(str(p.parent.relative_to(MANIFESTS))
                          for p in (MANIFESTS / "components").glob("*/kustomization.yaml"))]

Doc = dict[str, object]
# The chart's hooks: the `helm test` pod (and its account), what it asks each extender replica,
# and the CRD upgrade hook.
TEST_POD = "gpufrag-test-extender-answers"
TEST_PATHS = ("/healthz", "/readyz")
CRD_HOOK = "gpufrag-crd-upgrade"


def run_helm(helm: Path, *args: str, check: bool = True, kubeconfig: Path | None = None
             ) -> subprocess.CompletedProcess[str]:
    """``helm args`` in the repository's root; with ``kubeconfig``, against that cluster (as
    $KUBECONFIG, so the command line is the one a user types)."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)} if kubeconfig else None
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                            check=False, cwd=REPO, env=env)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result


def helm_template(helm: Path, *args: str, release: str = "gpufrag",
                  tests: bool = False) -> list[Doc]:
    """What an install applies: the templates and crds/ (which Helm installs first); with
    ``tests``, the ``helm test`` hooks too."""
    out = run_helm(helm, "template", release, str(CHART), "--include-crds", *args).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    return docs if tests else [d for d in docs if not is_hook(d)]


def annotations_of(doc: Doc) -> dict[str, str]:
    meta = doc.get("metadata")
    found = meta.get("annotations") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def labels_of(doc: Doc) -> dict[str, str]:
    meta = doc.get("metadata")
    found = meta.get("labels") if isinstance(meta, dict) else None
    return found if isinstance(found, dict) else {}


def tree(doc: Doc) -> Any:
    """``doc`` for reading nested fields (what a test reads is checked by its assertions)."""
    return doc


def is_hook(doc: Doc) -> bool:
    return manifests.HOOK_ANNOTATION in annotations_of(doc)


def without_chart_metadata(doc: Doc, base: Doc) -> Doc:
    """``doc`` without what the chart adds to every base object: its standard labels, the
    name label where ``base`` has none, and Helm's keep policy (on the Namespace, which
    uninstall must not delete)."""
    added = set(manifests.STANDARD_LABELS) | ({manifests.NAME_LABEL} - set(labels_of(base)))
    meta = {k: v for k, v in tree(doc)["metadata"].items()
            if k not in ("labels", "annotations")}
    kept_labels = {k: v for k, v in labels_of(doc).items() if k not in added}
    kept_annotations = {k: v for k, v in annotations_of(doc).items()
                        if k != manifests.KEEP_ANNOTATION}
    meta |= ({"labels": kept_labels} if kept_labels else {}) | (
        {"annotations": kept_annotations} if kept_annotations else {})
    return {**doc, "metadata": meta}


def kustomize(binary: Path, path: str) -> list[Doc]:
    """``kubectl kustomize manifests/<path>`` (or an absolute path) as a list of objects."""
    result = subprocess.run([str(binary), "kubectl", "kustomize", str(MANIFESTS / path)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


# The values under which the chart renders the base's layout (its namespace, created by the
# chart, and the example), as --set flags.
BASE = manifests.set_flags(manifests.BASE_LAYOUT)
EXAMPLE = "resnet-serving"  # what the example's objects' names start with


def moved_to(docs: Sequence[Doc], namespace: str) -> list[Doc]:
    """``docs`` with every mention of the base's namespace naming ``namespace`` instead (the
    base has no look-alike of it: a name that merely starts with it)."""
    text = yaml.safe_dump_all(docs, sort_keys=False)
    assert f"{manifests.BASE_NAMESPACE}-" not in text
    return [d for d in yaml.safe_load_all(text.replace(manifests.BASE_NAMESPACE, namespace)) if d]


def identity(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    assert isinstance(meta, dict)
    return (str(doc["apiVersion"]), str(doc["kind"]), str(meta.get("namespace", "")),
            str(meta["name"]))


def by_identity(docs: Sequence[Doc]) -> dict[tuple[str, str, str, str], Doc]:
    keyed = {identity(d): d for d in docs}
    assert len(keyed) == len(docs), "two rendered objects share apiVersion, kind, namespace, name"
    return keyed


def find(docs: Sequence[Doc], kind: str, name: str) -> Doc:
    return next(d for d in docs if identity(d)[1] == kind and identity(d)[3] == name)


def pod_specs(docs: Sequence[Doc]) -> Iterator[tuple[Doc, dict[str, object]]]:
    for doc in docs:
        spec = doc.get("spec")
        if not isinstance(spec, dict):
            continue
        if "jobTemplate" in spec:
            spec = spec["jobTemplate"]["spec"]
        template = spec.get("template")
        if isinstance(template, dict):
            yield doc, template["spec"]


def images(docs: Sequence[Doc]) -> list[str]:
    return [c["image"] for _, pod in pod_specs(docs)
            for key in ("initContainers", "containers") for c in pod.get(key, [])]  # type: ignore[attr-defined]


def dry_run(plane: ControlPlane, docs: Sequence[Doc]) -> None:
    """A server-side dry run of ``docs``. A Pod's admission looks its ServiceAccount up, which
    a dry run does not create: the ServiceAccounts that bare Pods (the test hook) name are
    created for the dry run and deleted after it."""
    accounts = [d for d in docs if d["kind"] == "ServiceAccount" and identity(d)[3] in {
        tree(p)["spec"].get("serviceAccountName") for p in docs if p["kind"] == "Pod"}]
    if accounts:
        plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(accounts))
    try:
        result = plane.kubectl("apply", "--dry-run=server", "-f", "-",
                               input_text=yaml.safe_dump_all(docs), check=False)
    finally:
        if accounts:
            plane.kubectl("delete", "-f", "-", input_text=yaml.safe_dump_all(accounts),
                          check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


def ensure_namespace(plane: ControlPlane, name: str) -> None:
    # A dry-run Namespace is not persisted, so namespaced objects need the real one.
    if plane.kubectl("get", "namespace", name, check=False).returncode != 0:
        plane.kubectl("create", "namespace", name)


# --------------------------------------------------------------------------------------------


def test_the_manifests_are_rendered_from_the_current_chart(helm: Path) -> None:
    """manifests/ (the base's and the components' resources) is what the chart renders today:
    a change to a template fails here until the manifests are rendered again."""
    stale = manifests.stale_files(manifests.render(helm))
    assert not stale, (f"not what charts/gpufrag renders: "
                       f"{', '.join(str(p.relative_to(REPO)) for p in stale)}; "
                       f"run `{manifests.REGENERATE}`")


def test_the_base_layout_renders_exactly_the_kustomize_base(helm: Path,
                                                            control_plane_binary: Path) -> None:
    """With the base's layout, the release named gpufrag renders the base's objects with the
    base's names; the chart adds only its standard labels (not to the CRD, which Helm does not
    template) and the keep policy on the Namespace."""
    rendered = by_identity(helm_template(helm, *BASE))
    base = by_identity(kustomize(control_plane_binary, "base"))
    assert sorted(rendered) == sorted(base)
    differ = [key for key in base if without_chart_metadata(rendered[key], base[key]) != base[key]]
    assert not differ, f"objects that differ from the base: {differ}"
    kept = [key[1] for key, doc in rendered.items()
            if annotations_of(doc).get(manifests.KEEP_ANNOTATION) == "keep"]
    assert kept == ["Namespace"]
    version = manifests.project_version()
    standard = {"helm.sh/chart": f"gpufrag-{version}", "app.kubernetes.io/instance": "gpufrag",
                "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/version": version}
    unlabelled = [key for key, doc in rendered.items() if key[1] != "CustomResourceDefinition"
                  and {k: labels_of(doc).get(k) for k in standard} != standard]
    assert not unlabelled, f"objects without the standard labels: {unlabelled}"


def test_default_values_render_the_base_in_the_release_namespace_without_the_example(
        helm: Path, control_plane_binary: Path) -> None:
    """What ``helm install gpufrag charts/gpufrag -n ml-platform --create-namespace`` applies:
    the base's objects but its Namespace (helm has made the release's: a second one would fail
    the install) and the example's, with every namespaced object in the release's namespace and
    every reference to the namespace naming it -- RBAC subjects, the admission policies' user
    names, the scheduler's lease, the hints' location -- and nothing naming gpufrag-system."""
    rendered = helm_template(helm, "-n", "ml-platform")
    expected = [d for d in moved_to(kustomize(control_plane_binary, "base"), "ml-platform")
                if d["kind"] != "Namespace" and not identity(d)[3].startswith(EXAMPLE)]
    same_objects(rendered, expected)
    assert manifests.BASE_NAMESPACE not in yaml.safe_dump_all(rendered)
    # Only the RoleBinding to kube-system's authentication reader lives elsewhere, by design.
    assert {identity(d)[2] for d in rendered} == {"", "ml-platform", "kube-system"}
    assert [identity(d)[1] for d in rendered if identity(d)[2] == "kube-system"] == [
        "RoleBinding"]
    # The example is one value away; the optional parts follow the release's namespace too.
    example = helm_template(helm, "-n", "ml-platform", "--set", "servingExample.enabled=true",
                            "--set", "monitoring.enabled=true")
    assert {identity(d)[1] for d in example if identity(d)[3].startswith(EXAMPLE)} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "CronJob",
        "ServiceAccount", "Role", "RoleBinding", "ServiceMonitor"}
    assert {identity(d)[2] for d in example} == {"", "ml-platform", "kube-system"}


def test_a_namespace_the_chart_creates_is_named_and_not_the_releases(helm: Path) -> None:
    """namespace.create makes namespace.name, with the base's Pod Security labels and kept on
    uninstall; without a name, or naming the release's own namespace (which exists before any
    object: helm keeps the release there), it is refused before anything is applied."""
    docs = helm_template(helm, "-n", "default", "--set", "namespace.create=true", "--set",
                         "namespace.name=gpu-team")
    created = find(docs, "Namespace", "gpu-team")
    assert annotations_of(created)[manifests.KEEP_ANNOTATION] == "keep"
    assert labels_of(created)["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {identity(d)[2] for d in docs} == {"", "gpu-team", "kube-system"}
    unnamed = run_helm(helm, "template", "gpufrag", str(CHART), "-n", "gpu-team", "--set",
                       "namespace.create=true", check=False)
    assert unnamed.returncode != 0
    assert "values don't meet the specifications of the schema" in unnamed.stderr
    assert "namespace" in unnamed.stderr and "name" in unnamed.stderr
    own = run_helm(helm, "template", "gpufrag", str(CHART), "-n", "gpu-team", "--set",
                   "namespace.create=true", "--set", "namespace.name=gpu-team", check=False)
    assert own.returncode != 0
    assert ("namespace.create: the release's namespace gpu-team exists before the chart's "
            "objects") in own.stderr


def without_final_newlines(docs: Sequence[Doc]) -> list[Doc]:
    """``docs`` with each ConfigMap's data strings without their final newlines."""
    return [{**d, "data": {k: v.rstrip("\n") for k, v in tree(d)["data"].items()}}
            if d["kind"] == "ConfigMap" and "data" in d else d for d in docs]


def same_objects(rendered: Sequence[Doc], kustomized: Sequence[Doc]) -> None:
    """``rendered`` (by helm) holds exactly the objects of ``kustomized``, but for what the
    chart adds to every object."""
    by_key, base = by_identity(rendered), by_identity(kustomized)
    assert sorted(by_key) == sorted(base)
    differ = [key for key in base if without_chart_metadata(by_key[key], base[key]) != base[key]]
    assert not differ, f"objects that differ from kustomize's: {differ}"


# The production overlay's layout as values (docs/operations.md, "Roll out safely").
PRODUCTION = ["--set", "scheduler.replicas=2", "--set", "scheduler.leaderElect=true",
              "--set", "extender.ignorable=false", "--set", "extender.bind=true",
              "--set", "defrag.dryRun=false", "--set", "scheduler.disruptionBudget=true"]


def test_production_values_render_exactly_the_production_overlay(
        helm: Path, control_plane_binary: Path) -> None:
    # The overlay replaces the scheduler's config by a JSON patch, whose value kustomize
    # writes without the base's final newline; nothing else may differ.
    same_objects(without_final_newlines(helm_template(helm, *BASE, *PRODUCTION)),
                 without_final_newlines(kustomize(control_plane_binary, "overlays/production")))


def test_each_optional_part_renders_exactly_its_kustomize_component(
        helm: Path, control_plane_binary: Path) -> None:
    """Off by default (the base layout's render is the base); on, each adds exactly the objects of
    its component under manifests/components. A part that joins two (the webhook's monitor)
    adds its objects only where both are on: each of the two alone renders exactly its own
    component, and both together add exactly the joint one."""
    base = set(by_identity(kustomize(control_plane_binary, "base")))
    for component, values in manifests.PARTS.items():
        # What the same values turn on beside this part: the parts whose values are a subset.
        others = set(base)
        for other, other_values in manifests.PARTS.items():
            if other != component and set(other_values) < set(values):
                others |= set(by_identity(kustomize(control_plane_binary,
                                                    f"components/{other}")))
        rendered = [d for d in helm_template(helm, *BASE, *manifests.set_flags(values))
                    if identity(d) not in others]
        same_objects(rendered, kustomize(control_plane_binary, f"components/{component}"))


def test_the_monitoring_labels_and_the_no_cert_manager_path(helm: Path) -> None:
    docs = helm_template(helm, "--set", "monitoring.enabled=true", "--set",
                         "servingExample.enabled=true", "--set",
                         "monitoring.labels.release=kube-prometheus-stack", "--set",
                         "rightsizing.enabled=true", "--set", "rightsizing.certManager=false",
                         "--set", "rightsizing.caBundle=Q0EK")
    monitors = [d for d in docs if str(d["apiVersion"]).startswith("monitoring.coreos.com/")]
    # The extender's, the agent's, the device plugin's and the webhook's PodMonitors, the
    # example's ServiceMonitor and the rules.
    assert sorted(identity(d)[3] for d in monitors) == [
        "gpufrag", "gpufrag-admission", "gpufrag-agent", "gpufrag-device-plugin",
        "gpufrag-extender", "resnet-serving"]
    assert {labels_of(d).get("release") for d in monitors} == {"kube-prometheus-stack"}
    assert "cert-manager.io/v1" not in {d["apiVersion"] for d in docs}
    webhook = tree(find(docs, "MutatingWebhookConfiguration", "gpufrag-rightsizing"))
    assert [w["clientConfig"]["caBundle"] for w in webhook["webhooks"]] == ["Q0EK"]
    # Release-scoped like every cluster-wide name.
    other = helm_template(helm, "--set", "rightsizing.enabled=true", release="team-b")
    assert find(other, "MutatingWebhookConfiguration", "team-b-gpufrag-rightsizing")
    # cert-manager's certificate names the Service in the release's namespace, and the
    # webhook's monitor verifies the name it holds.
    moved = helm_template(helm, "--set", "rightsizing.enabled=true", "--set",
                          "monitoring.enabled=true", "--set", "namespace.name=team-b")
    dns_names = tree(find(moved, "Certificate", "gpufrag-admission"))["spec"]["dnsNames"]
    assert dns_names == ["gpufrag-admission.team-b.svc",
                         "gpufrag-admission.team-b.svc.cluster.local"]
    (endpoint,) = tree(find(moved, "PodMonitor", "gpufrag-admission"))["spec"][
        "podMetricsEndpoints"]
    assert endpoint["tlsConfig"]["serverName"] == dns_names[0]


SELF_SIGNED = ["--set", "rightsizing.enabled=true", "--set", "rightsizing.certManager=false",
               "--set", "rightsizing.selfSigned=true"]


def self_signed(docs: Sequence[Doc], namespace: str) -> tuple[dict[str, str], list[str]]:
    """The webhook's Secret's data (base64) and each webhook's caBundle (of every
    configuration: right-sizing's, and with dra.enabled the conversion into claims)."""
    secret = tree(find(docs, "Secret", "gpufrag-admission-tls"))
    assert secret["type"] == "kubernetes.io/tls" and identity(secret)[2] == namespace
    return secret["data"], [w["clientConfig"]["caBundle"] for d in docs
                            if d["kind"] == "MutatingWebhookConfiguration"
                            for w in tree(d)["webhooks"]]


def test_the_chart_makes_the_webhooks_certificate_without_cert_manager(helm: Path) -> None:
    """rightsizing.selfSigned: a CA and a serving certificate for the webhook Service's DNS
    names in the release's namespace, signed by that CA, in the Secret the webhook mounts, and
    that CA in every webhook's caBundle."""
    docs = helm_template(helm, *SELF_SIGNED, "--set", "namespace.name=team-b", "--set",
                         "monitoring.enabled=true", "--set", "dra.enabled=true")
    data, bundles = self_signed(docs, "team-b")
    assert bundles == [data["ca.crt"]] * 2  # one CA, made once, in both configurations
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    cert.verify_directly_issued_by(ca)  # raises where the CA did not sign it
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "gpufrag-admission.team-b.svc", "gpufrag-admission.team-b.svc.cluster.local"]
    # The webhook's PodMonitor verifies that certificate: against the Secret's CA, for a name
    # the certificate holds (it dials the pod's IP, which the certificate does not name).
    monitor = tree(find(docs, "PodMonitor", "gpufrag-admission"))
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https" and "insecureSkipVerify" not in endpoint["tlsConfig"]
    assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": "gpufrag-admission-tls",
                                                      "key": "ca.crt"}}
    assert endpoint["tlsConfig"]["serverName"] in names.get_values_for_type(x509.DNSName)
    assert "cert-manager.io/v1" not in {d["apiVersion"] for d in docs}
    key = serialization.load_pem_private_key(base64.b64decode(data["tls.key"]), None)
    spki = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)


def test_helm_lint_strict_passes(helm: Path) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    # With every optional part, the production layout and the pull settings on.
    result = run_helm(helm, "lint", "--strict", str(CHART), *EVERYTHING, "--set",
                      "rightsizing.certManager=true", "--set", "global.imagePullPolicy=Always",
                      "--set", "global.imagePullSecrets[0].name=pull", "--set",
                      "global.imageRegistry=mirror.example.com")
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_kustomize_image_is_fully_qualified(control_plane_binary: Path, path: str) -> None:
    refs = images(kustomize(control_plane_binary, path))
    assert [r for r in refs if not has_registry_host(r)] == []


def test_every_chart_image_is_fully_qualified(helm: Path) -> None:
    refs = images(helm_template(helm, *BASE))
    assert refs and [r for r in refs if not has_registry_host(r)] == []
    assert "registry.k8s.io/kube-scheduler:v1.36.3" in refs


def test_default_chart_is_accepted_by_the_api_server(helm: Path,
                                                     control_plane: ControlPlane) -> None:
    """Every object an install applies, the example's too, and the hooks (``helm test``'s, the
    CRD upgrade's)."""
    ensure_namespace(control_plane, manifests.BASE_NAMESPACE)
    dry_run(control_plane, helm_template(helm, *BASE, tests=True))


OVERRIDES = {
    "images": {"gpufrag": {"repository": "registry.example.com/ml/gpufrag", "tag": "0.2.0",
                           "digest": "sha256:" + "ab" * 32}},
    "scheduler": {"replicas": 2, "leaderElect": True,
                  "resources": {"requests": {"cpu": "300m", "memory": "256Mi"},
                                "limits": {"cpu": "2", "memory": "1Gi"}}},
    "extender": {"policy": "bestfit", "weight": 50, "ignorable": False},
    "defrag": {"schedule": "0 * * * *", "dryRun": False, "threshold": 0.4,
               "maxEvictionsPerNode": 1, "maxEvictionsPerNamespace": 3, "maxEvictionsTotal": 7},
    # Helm merges maps with the defaults: null removes the default key.
    "agent": {"intervalS": 30, "nodeSelector": {"gpu": "yes", "nvidia.com/gpu.present": None},
              "tolerations": []},
    "servingExample": {"enabled": False},
}


def test_values_reach_the_objects_and_the_api_server_accepts_them(
        helm: Path, control_plane: ControlPlane, tmp_path: Path) -> None:
    namespace = f"e2e-helm-{uuid.uuid4().hex[:8]}"
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({**OVERRIDES, "namespace": {"name": namespace}}))
    docs = helm_template(helm, "--values", str(values))

    namespaces = {identity(d)[2] for d in docs} - {""}
    assert namespace in namespaces and namespaces <= {namespace, "kube-system"}
    assert manifests.BASE_NAMESPACE not in yaml.safe_dump_all(docs)
    assert not [d for d in docs if identity(d)[3].startswith("resnet-serving")]
    names = find(docs, "ConfigMap", "gpufrag-names")["data"]
    assert names["GPUFRAG_NAMES__HINTS_NAMESPACE"] == namespace  # type: ignore[index]
    subjects = [s for d in docs if "subjects" in d for s in d["subjects"]]  # type: ignore[attr-defined]
    assert {s["namespace"] for s in subjects} == {namespace}

    sched = find(docs, "Deployment", "gpufrag-scheduler")
    assert sched["spec"]["replicas"] == 2  # type: ignore[index]
    containers = {c["name"]: c for c in sched["spec"]["template"]["spec"]["containers"]}  # type: ignore[index]
    assert containers["extender"]["image"] == ("registry.example.com/ml/gpufrag:0.2.0@sha256:"
                                               + "ab" * 32)
    assert containers["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    assert containers["kube-scheduler"]["resources"] == OVERRIDES["scheduler"]["resources"]  # type: ignore[index]
    sched_text = find(docs, "ConfigMap", "gpufrag-scheduler-config")["data"]["config.yaml"]  # type: ignore[index]
    sched_config = yaml.safe_load(sched_text)
    assert sched_config["leaderElection"] == {"leaderElect": True, "resourceNamespace": namespace,
                                              "resourceName": "gpufrag-scheduler"}
    assert sched_config["extenders"][0]["weight"] == 50
    assert sched_config["extenders"][0]["ignorable"] is False
    ext_config = find(docs, "ConfigMap", "gpufrag-extender-config")["data"]["config.yaml"]  # type: ignore[index]
    assert yaml.safe_load(ext_config) == {"policy": "bestfit",
                                          "filter": {"answer": "decide", "nodes": 1}}

    cron = find(docs, "CronJob", "gpufrag-defrag")
    assert cron["spec"]["schedule"] == "0 * * * *"  # type: ignore[index]
    defrag = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert {"name": "GPUFRAG_DEFRAG_DRY_RUN", "value": "false"} in defrag["env"]
    assert ("--threshold=0.4 --max-evictions-per-node=1 --max-evictions-per-namespace=3 "
            "--max-evictions-total=7 ") in defrag["args"][0]
    agent = find(docs, "DaemonSet", "gpufrag-agent")["spec"]["template"]["spec"]  # type: ignore[index]
    assert "--interval-s=30" in agent["containers"][0]["args"]
    assert agent["nodeSelector"] == {"gpu": "yes"} and agent["tolerations"] == []

    ensure_namespace(control_plane, namespace)
    try:
        dry_run(control_plane, docs)
        # The templated KubeSchedulerConfiguration is one kube-scheduler loads (the harness
        # turns leader election off).
        name = f"helm-{namespace}"
        control_plane.start_scheduler(name, sched_text)
        control_plane.stop_scheduler(name)
    finally:
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


class Workload(NamedTuple):
    """A workload whose pods take ``<value>.nodeSelector``, ``.tolerations``, ``.affinity`` and
    ``.priorityClassName``."""

    value: str
    kind: str
    name: str


WORKLOADS = (Workload("scheduler", "Deployment", "gpufrag-scheduler"),
             Workload("defrag", "CronJob", "gpufrag-defrag"),
             Workload("agent", "DaemonSet", "gpufrag-agent"),
             Workload("devicePlugin", "DaemonSet", "gpufrag-device-plugin"),
             Workload("servingExample", "Deployment", "resnet-serving"),
             Workload("rightsizing", "Deployment", "gpufrag-admission"))
PULL_AND_PLACEMENT = {
    "global": {"imageRegistry": "mirror.example.com/cache", "imagePullPolicy": "Always",
               "imagePullSecrets": [{"name": "mirror-pull"}]},
    **{component.value: {
        "nodeSelector": {"pool": component.value},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": component.value,
                         "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "In", "values": [component.value]}]}]}}},
        "priorityClassName": f"{component.value.lower()}-priority"}
       for component in WORKLOADS},
}
PULL_AND_PLACEMENT["devicePlugin"]["resources"] = {  # type: ignore[index]
    "requests": {"cpu": "20m", "memory": "32Mi"}}
PULL_AND_PLACEMENT["servingExample"]["enabled"] = True  # type: ignore[index]
# The webhook's Deployment too (without cert-manager, whose CRDs this API server lacks).
PULL_AND_PLACEMENT["rightsizing"] |= {  # type: ignore[operator]
    "enabled": True, "certManager": False, "caBundle": "Q0EK"}


def test_pull_settings_and_scheduling_knobs_reach_every_pod(
        helm: Path, control_plane: ControlPlane, tmp_path: Path) -> None:
    """global.* reach every container and pod, the hooks' included; each component's pods
    take their own nodeSelector, tolerations, affinity and priorityClassName (a map merges
    with the default, so the agent keeps its GPU-node selector); the API server accepts it."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(PULL_AND_PLACEMENT))
    docs = helm_template(helm, "--values", str(values), tests=True)
    pods = list(pod_specs(docs)) + [(d, tree(d)["spec"]) for d in docs if d["kind"] == "Pod"]
    assert len(pods) >= len(WORKLOADS) + 1
    for doc, pod in pods:
        where = identity(doc)
        assert pod["imagePullSecrets"] == [{"name": "mirror-pull"}], where
        for container in [*tree(pod).get("initContainers", []), *tree(pod)["containers"]]:
            assert container["imagePullPolicy"] == "Always", where
            assert container["image"].startswith("mirror.example.com/cache/"), where
    refs = images(docs)
    assert "mirror.example.com/cache/gpufrag/gpufrag:0.1.0" in refs
    assert "mirror.example.com/cache/kube-scheduler:v1.36.3" in refs

    for component in WORKLOADS:
        doc = find(docs, component.kind, component.name)
        pod = next(spec for _, spec in pod_specs([doc]))
        wanted = tree(PULL_AND_PLACEMENT)[component.value]
        expected_selector = dict(wanted["nodeSelector"])
        if component.value in ("agent", "devicePlugin"):
            expected_selector["nvidia.com/gpu.present"] = "true"
        assert pod["nodeSelector"] == expected_selector, component.value
        for name in ("tolerations", "affinity", "priorityClassName"):
            assert pod[name] == wanted[name], (component.value, name)
    plugin = find(docs, "DaemonSet", "gpufrag-device-plugin")
    resources = tree(next(spec for _, spec in pod_specs([plugin])))["containers"][0]["resources"]
    # Merged with the default, as every map value is: the requests set, the default limits kept.
    assert resources["requests"] == {"cpu": "20m", "memory": "32Mi"} and resources["limits"]

    dry_run(control_plane, docs)  # in the release's namespace: default


def test_default_values_set_no_pull_or_placement_field_the_base_leaves_out(helm: Path) -> None:
    docs = helm_template(helm, *BASE, tests=True)
    assert "imagePullPolicy" not in yaml.safe_dump_all(docs)
    assert "imagePullSecrets" not in yaml.safe_dump_all(docs)
    assert "affinity" not in yaml.safe_dump_all(docs)


def cluster_wide_names(docs: Sequence[Doc]) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of the objects two releases could collide on: everything but
    what lives in the release's own namespace, the Namespace (a value) and the shared CRD."""
    return {(identity(d)[1], identity(d)[2], identity(d)[3]) for d in docs
            if identity(d)[2] in ("", "kube-system")
            and identity(d)[1] not in ("Namespace", "CustomResourceDefinition")}


def test_a_second_release_shares_no_cluster_wide_name_with_the_first(helm: Path) -> None:
    first = helm_template(helm)
    second = helm_template(helm, "--set", "namespace.name=team-b", release="team-b")
    first_names, second_names = cluster_wide_names(first), cluster_wide_names(second)
    assert len(first_names) == len(second_names) > 5
    assert not first_names & second_names
    assert {name for _, _, name in second_names} == {
        name.replace("gpufrag", "team-b-gpufrag", 1) for _, _, name in first_names}
    # Each binding points at its own release's ClusterRole, never the other release's.
    roles = {identity(d)[3] for d in second if identity(d)[1] == "ClusterRole"}
    refs = [tree(d)["roleRef"]["name"] for d in second
            if "roleRef" in d and tree(d)["roleRef"]["kind"] == "ClusterRole"]
    own = [ref for ref in refs if not ref.startswith("system:")]
    assert own and set(own) <= roles
    assert {labels_of(d).get("app.kubernetes.io/instance") for d in second
            if identity(d)[1] != "CustomResourceDefinition"} == {"team-b"}
    override = helm_template(helm, "--set", "fullnameOverride=gpu-sched", release="team-b")
    assert all(name.startswith("gpu-sched-") for _, _, name in cluster_wide_names(override))


def test_the_scheduler_name_is_one_value_everywhere_it_is_read(helm: Path) -> None:
    """scheduler.name is the profile kube-scheduler answers to, the name the extender and the
    device plugin read (names.scheduler_name), and the example's spec.schedulerName: a second
    release answers to a name of its own."""
    docs = helm_template(helm, "--set", "scheduler.name=gpufrag-team-b", "--set",
                         "servingExample.enabled=true")
    config = yaml.safe_load(tree(find(docs, "ConfigMap", "gpufrag-scheduler-config"))["data"][
        "config.yaml"])
    assert [p["schedulerName"] for p in config["profiles"]] == ["gpufrag-team-b"]
    names = tree(find(docs, "ConfigMap", "gpufrag-names"))["data"]
    assert names["GPUFRAG_NAMES__SCHEDULER_NAME"] == "gpufrag-team-b"
    serving = tree(find(docs, "Deployment", "resnet-serving"))
    assert serving["spec"]["template"]["spec"]["schedulerName"] == "gpufrag-team-b"
    assert "schedulerName: gpufrag-scheduler" not in yaml.safe_dump_all(docs)


def test_helm_test_hooks_ask_every_extender_replicas_probe_listener(helm: Path) -> None:
    """The hooks are a Pod in the gpufrag image that lists the scheduler's pods by the
    Deployment's own selector and GETs /healthz and /readyz on each one's ext-health port, and
    the ServiceAccount, Role (list pods, nothing else) and RoleBinding it runs as."""
    docs = helm_template(helm, "-n", "ml-platform", tests=True)
    hooks = {identity(d)[1]: tree(d) for d in docs
             if annotations_of(d).get(manifests.HOOK_ANNOTATION) == "test"}
    assert sorted(hooks) == ["Pod", "Role", "RoleBinding", "ServiceAccount"]
    pod, role = hooks["Pod"], hooks["Role"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    assert hooks["RoleBinding"]["subjects"][0]["name"] == pod["spec"]["serviceAccountName"]
    # Created before the pod, deleted with it when it passes.
    weights = {kind: int(annotations_of(d)["helm.sh/hook-weight"]) for kind, d in hooks.items()}
    assert weights["Pod"] > max(w for kind, w in weights.items() if kind != "Pod")
    scheduler = tree(find(docs, "Deployment", "gpufrag-scheduler"))["spec"]
    extender = next(c for c in scheduler["template"]["spec"]["containers"]
                    if c["name"] == "extender")
    (container,) = pod["spec"]["containers"]
    assert container["image"] == extender["image"]
    selector, port = container["command"][3:5]
    assert dict(kv.split("=") for kv in selector.split(",")) == scheduler["selector"][
        "matchLabels"]
    assert {"name": "ext-health", "containerPort": int(port)} in extender["ports"]
    assert container["command"][6:] == list(TEST_PATHS)
    assert {identity(d)[2] for d in hooks.values()} == {"ml-platform"}
    assert pod["spec"]["restartPolicy"] == "Never"


def test_the_test_pods_check_passes_on_a_ready_extender_and_fails_without_one(
        helm: Path, control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    """The hook Pod's own command, run here against a real API server and a real extender's
    probe listener: it finds the pod that carries the scheduler's labels (here a Pod object
    whose status gives the loopback as its IP, where the extender listens), and exits 0 with
    both answers; with nothing listening, non-zero within its deadline, naming the pod and the
    path; with no such pod, non-zero naming the selector."""
    (pod,) = [d for d in helm_template(helm, tests=True) if identity(d)[1] == "Pod"]
    command = tree(pod)["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "-c"]
    script, selector, _, _, *paths = command[2:]
    labels = dict(kv.split("=") for kv in selector.split(","))
    core = kubernetes.client.CoreV1Api(control_plane.api_client())
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig_path),
           "POD_NAMESPACE": namespace}
    env.pop("KUBERNETES_SERVICE_HOST", None)

    def check(port: int, deadline_s: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", script, selector, str(port),
                               str(deadline_s), *paths], capture_output=True, text=True,
                              timeout=90, env=env, check=False)

    nobody = check(free_port(), 1)
    assert nobody.returncode != 0 and f"no pod {selector} in {namespace}" in nobody.stderr

    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "replica-0", "labels": labels},
        # Never scheduled (no such scheduler): only its status, set below, matters here.
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "x"}]}})
    core.patch_namespaced_pod_status("replica-0", namespace, {"status": {
        "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})
    health_port = free_port()
    extender = ExtenderProcess(control_plane, tmp_path / "extender.log", extra_args=(
        "--set", "server.health_host=127.0.0.1", "--set", f"server.health_port={health_port}"))
    extender.start()
    try:
        passed = check(health_port, 30)
    finally:
        extender.stop()
    assert passed.returncode == 0, passed.stderr
    assert passed.stdout.count("replica-0 http://127.0.0.1:") == len(paths) == 2
    assert passed.stdout.count(" 200 ok") == len(paths)
    failed = check(health_port, 1)
    assert failed.returncode != 0
    assert (f"replica-0 http://127.0.0.1:{health_port}/healthz: no 200 within the deadline"
            in failed.stderr)


@pytest.mark.parametrize(("flag", "field"), [
    ("defrag.threshold=high", "threshold"),
    ("extender.policy=fastest", "policy"),
    ("scheduler.replica=2", "replica"),
    ("images.gpufrag.repository=", "repository"),
    # What the binaries refuse at start (a crash loop), refused at install instead:
    ("defrag.threshold=2", "threshold"),
    ("defrag.threshold=1.5", "threshold"),
    ("defrag.maxEvictionsTotal=-1", "maxEvictionsTotal"),
    ("agent.intervalS=0", "intervalS"),
    ("scheduler.replicas=-1", "replicas"),
    ("extender.weight=0", "weight"),
    # Two kube-schedulers without leader election would both bind.
    ("scheduler.replicas=2", "leaderElect"),
    # Pull settings and names.
    ("global.imagePullPolicy=Sometimes", "imagePullPolicy"),
    ("global.imagePullSecrets[0]=mirror-pull", "imagePullSecrets"),
    ("global.imageRegistry=a registry", "imageRegistry"),
    ("fullnameOverride=Not_A_Name", "fullnameOverride"),
    ("agent.affinity=near", "affinity"),
    ("scheduler.name=Gpufrag_Scheduler", "name"),
    ("monitoring.enabled=maybe", "enabled"),
    ("monitoring.labels=release", "labels"),
    ("crds.upgrade=sometimes", "upgrade"),
    # A PodDisruptionBudget of minAvailable 1 over one replica blocks every drain.
    ("scheduler.disruptionBudget=true", "replicas"),
    # The chart's certificate or cert-manager's, never both.
    ("rightsizing.selfSigned=true", "certManager"),
])
def test_bad_values_are_refused_naming_the_field(helm: Path, flag: str, field: str) -> None:
    result = run_helm(helm, "template", "gpufrag", str(CHART), "--set", flag, check=False)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert field in result.stderr


def test_two_scheduler_replicas_render_with_leader_election(helm: Path) -> None:
    docs = helm_template(helm, "--set", "scheduler.replicas=2", "--set",
                         "scheduler.leaderElect=true", "--set", "defrag.threshold=0.3")
    scheduler = find(docs, "Deployment", "gpufrag-scheduler")
    assert scheduler["spec"]["replicas"] == 2  # type: ignore[index]


def test_extender_dra_asks_the_extender_about_dra_pods_and_turns_its_claims_reader_on(
        helm: Path) -> None:
    """A DRA pod requests no resource a managedResources list could name, and kube-scheduler
    asks an extender only about pods requesting one (docs/dra.md, "Scheduling DRA pods"): with
    extender.dra the list is left out and the extender's own loader reads dra.enabled; by
    default the list stays and DRA is off."""

    def configs(*values: str) -> tuple[dict[str, Any], ExtenderConfig]:
        docs = helm_template(helm, *values)
        scheduler = yaml.safe_load(find(docs, "ConfigMap", "gpufrag-scheduler-config")["data"][
            "config.yaml"])  # type: ignore[index]
        extender = yaml.safe_load(find(docs, "ConfigMap", "gpufrag-extender-config")["data"][
            "config.yaml"])  # type: ignore[index]
        (entry,) = scheduler["extenders"]
        return entry, config_from_mapping(extender)

    entry, config = configs()
    assert {"nvidia.com/gpu", "gpufrag.io/gpu-milli"} <= {
        r["name"] for r in entry["managedResources"]}
    assert not config.dra.enabled
    entry, config = configs("--set", "extender.dra=true")
    assert "managedResources" not in entry
    assert entry["filterVerb"] == "filter"
    assert config.dra.enabled


def test_extender_dra_renders_exactly_the_base_with_the_dra_scheduling_component(
        helm: Path, control_plane_binary: Path, tmp_path: Path) -> None:
    """The kustomize side of extender.dra: the base with the dra-scheduling component is what
    the chart renders with the value (its files are that render's ConfigMaps)."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(MANIFESTS / "base", overlay)],
        "components": [os.path.relpath(MANIFESTS / "components" / "dra-scheduling", overlay)]}))
    for values in manifests.OVERRIDE_PARTS.values():
        assert values[0] == (("extender.dra", "true"),)
    same_objects(helm_template(helm, *BASE, "--set", "extender.dra=true"),
                 kustomize(control_plane_binary, str(overlay)))


def _install_as_users_do(helm: Path, plane: ControlPlane, release: str, namespace: str,
                         *values: str) -> list[Doc]:
    """``helm install <release> charts/gpufrag -n <namespace> --create-namespace [values]``,
    the command the peers' charts teach, run in the repository's root against ``plane``: it ends
    deployed, every namespaced object it made is in ``namespace`` (but the RoleBinding in
    kube-system, by design) and the API server holds each one. Returns the release's objects."""
    installed = run_helm(helm, "install", release, "charts/gpufrag", "-n", namespace,
                         "--create-namespace", *values, kubeconfig=plane.kubeconfig_path)
    assert "STATUS: deployed" in installed.stdout, installed.stdout
    status = run_helm(helm, "status", release, "-n", namespace, "-o", "json",
                      kubeconfig=plane.kubeconfig_path)
    assert json.loads(status.stdout)["info"]["status"] == "deployed"
    manifest = run_helm(helm, "get", "manifest", release, "-n", namespace,
                        kubeconfig=plane.kubeconfig_path).stdout
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    assert "Namespace" not in {identity(d)[1] for d in docs}
    assert {identity(d)[2] for d in docs} == {"", namespace, "kube-system"}
    assert [identity(d)[1] for d in docs if identity(d)[2] == "kube-system"] == ["RoleBinding"]
    subjects = [s for d in docs for s in tree(d).get("subjects", [])]
    assert subjects and {s["namespace"] for s in subjects} == {namespace}
    # Each object as the API server holds it, found where the manifest says it is.
    live = plane.kubectl("get", "-f", "-", "-o", "name", input_text=manifest)
    assert len(live.stdout.split()) == len(docs)
    return docs


def test_helm_install_with_create_namespace_deploys_into_the_release_namespace(
        helm: Path, control_plane_binary: Path) -> None:
    """Default values, a namespace other than the base's: nothing goes to, or names,
    gpufrag-system, and no part of the example is installed. On an API server of its own: the
    release's cluster-wide objects (admission policies among them) and its controllers' pods
    must not meet other tests' nodes and objects."""
    with ControlPlane(control_plane_binary) as plane:
        docs = _install_as_users_do(helm, plane, "gpufrag", "gpu-sched")
        assert manifests.BASE_NAMESPACE not in yaml.safe_dump_all(docs)
        assert not [identity(d) for d in docs if identity(d)[3].startswith(EXAMPLE)]
        workloads = plane.kubectl("get", "deployments,services,cronjobs,"
                                  "horizontalpodautoscalers,poddisruptionbudgets", "-n",
                                  "gpu-sched", "-o", "name").stdout.split()
        assert sorted(workloads) == ["cronjob.batch/gpufrag-defrag",
                                     "deployment.apps/gpufrag-scheduler"]


def test_helm_install_with_create_namespace_and_the_example(
        helm: Path, control_plane_binary: Path) -> None:
    """The same command in gpufrag-system (where a chart that made its own Namespace failed),
    with the example asked for: the example's
    Deployment, Service, PDB, HPA, pre-warm CronJobs and their RBAC are in the release's
    namespace, and its pods name the release's scheduler."""
    with ControlPlane(control_plane_binary) as plane:
        docs = _install_as_users_do(helm, plane, "demo", manifests.BASE_NAMESPACE,
                                    "--set", "servingExample.enabled=true")
        example = {(identity(d)[1], identity(d)[3]) for d in docs
                   if identity(d)[3].startswith(EXAMPLE)}
        assert {kind for kind, _ in example} == {
            "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "CronJob",
            "ServiceAccount", "Role", "RoleBinding"}
        serving = yaml.safe_load(plane.kubectl("get", "deployment", EXAMPLE, "-n",
                                               manifests.BASE_NAMESPACE, "-o", "yaml").stdout)
        assert serving["spec"]["template"]["spec"]["schedulerName"] == "gpufrag-scheduler"
        cronjobs = plane.kubectl("get", "cronjobs", "-n", manifests.BASE_NAMESPACE, "-o",
                                 "name").stdout.split()
        assert sorted(cronjobs) == ["cronjob.batch/gpufrag-defrag",
                                    f"cronjob.batch/{EXAMPLE}-prewarm",
                                    f"cronjob.batch/{EXAMPLE}-prewarm-end"]


def test_uninstall_keeps_the_crd_the_reservations_and_the_namespace(
        helm: Path, control_plane_binary: Path, tmp_path: Path,
        prometheus_operator_crds: list[Path], cert_manager_crds: list[Path]) -> None:
    """``helm install -n gpufrag-system --create-namespace`` then ``helm uninstall`` on a real
    API server of its own (the chart's cluster-wide names would collide with objects other tests
    applied): the GPUReservation CRD (in crds/), a live reservation and the gpufrag-system
    Namespace (helm's, which uninstall never deletes) are all still there, so no reservation is
    lost; the release's other objects are gone. A second release, in a namespace the chart
    creates (namespace.create), installs beside the first (release-scoped ClusterRoles and
    bindings) and leaves with its own uninstall, its Namespace kept by policy."""
    with ControlPlane(control_plane_binary) as plane:
        _install_and_uninstall(helm, plane, [*prometheus_operator_crds, *cert_manager_crds])
        _the_crd_hook_brings_back_the_charts_crd(helm, plane, tmp_path)


# Monitoring, dashboards, the webhook with its cert-manager certificate, the example, and the
# production layout.
EVERYTHING = ["--set", "monitoring.enabled=true", "--set", "dashboards.enabled=true",
              "--set", "rightsizing.enabled=true", "--set", "servingExample.enabled=true",
              *PRODUCTION]


def _install_and_uninstall(helm: Path, control_plane: ControlPlane,
                           operator_crds: Sequence[Path]) -> None:
    """``operator_crds``: the Prometheus Operator's and cert-manager's own CRDs of the kinds
    the chart renders, as upstream ships them (devkit.toolbuild.fetch_crds)."""
    kubeconfig = str(control_plane.kubeconfig_path)
    release = "keep-test"
    files = [arg for path in operator_crds for arg in ("-f", str(path))]
    control_plane.kubectl("apply", "--server-side", *files)
    control_plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", *files)
    run_helm(helm, "install", release, str(CHART), "--kubeconfig", kubeconfig,
             "--namespace", manifests.BASE_NAMESPACE, "--create-namespace", *EVERYTHING)
    for kind in ("prometheusrule", "podmonitor", "servicemonitor", "poddisruptionbudget",
                 "mutatingwebhookconfiguration", "issuer", "certificate"):
        listed = control_plane.kubectl("get", kind, "-n", manifests.BASE_NAMESPACE, "-o", "name")
        assert listed.stdout.strip(), f"no {kind} installed"
    # Strict field validation too (an unknown or misspelt field is an error, not pruned).
    dry_run(control_plane, helm_template(helm, *EVERYTHING, "-n", manifests.BASE_NAMESPACE))
    second = "team-b"
    # The second release makes its webhook's certificate itself; an upgrade keeps it.
    own_namespace = ["--set", f"namespace.name=gpufrag-{second}", "--set",
                     "namespace.create=true"]
    run_helm(helm, "install", second, str(CHART), "--kubeconfig", kubeconfig, "--namespace",
             "default", *own_namespace, "--set", f"scheduler.name=gpufrag-{second}",
             *SELF_SIGNED)
    installed = _webhook_certificate(control_plane, f"gpufrag-{second}", second)
    run_helm(helm, "upgrade", second, str(CHART), "--kubeconfig", kubeconfig, "--namespace",
             "default", *own_namespace, "--set", f"scheduler.name=gpufrag-{second}",
             *SELF_SIGNED, "--set", "crds.upgrade=false")
    assert _webhook_certificate(control_plane, f"gpufrag-{second}", second) == installed
    bindings = control_plane.kubectl("get", "clusterrolebindings", "-o", "name").stdout
    assert f"clusterrolebinding.rbac.authorization.k8s.io/{second}-gpufrag-agent" in bindings
    assert f"clusterrolebinding.rbac.authorization.k8s.io/{release}-gpufrag-agent" in bindings
    run_helm(helm, "uninstall", second, "--kubeconfig", kubeconfig, "--namespace", "default")
    bindings = control_plane.kubectl("get", "clusterrolebindings", "-o", "name").stdout
    assert f"/{second}-gpufrag-agent" not in bindings and f"/{release}-gpufrag-agent" in bindings
    assert control_plane.kubectl("get", "namespace", f"gpufrag-{second}",
                                 check=False).returncode == 0
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    try:
        custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, manifests.BASE_NAMESPACE, rsv.PLURAL, rsv.body(Reservation(
                name="held", node="n0", gpus=(0,), gpu_milli=300, owner_uid="rs-1",
                namespace="default", expires=time.time() + 300)))
        # An upgrade that changes the release keeps the live reservation. Without the CRD
        # hook here: its Job's pod would never run on this API server without a node (what
        # its container does is checked below, by running it).
        run_helm(helm, "upgrade", release, str(CHART), "--kubeconfig", kubeconfig,
                 "--namespace", manifests.BASE_NAMESPACE, *EVERYTHING, "--set",
                 "defrag.schedule=0 * * * *", "--set", "crds.upgrade=false")
        assert custom.get_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, manifests.BASE_NAMESPACE, rsv.PLURAL,
            "held")["spec"]["node"] == "n0"
    finally:
        run_helm(helm, "uninstall", release, "--kubeconfig", kubeconfig, "--namespace",
                 manifests.BASE_NAMESPACE)
    assert control_plane.kubectl("get", "crd", f"{rsv.PLURAL}.{rsv.GROUP}",
                                 check=False).returncode == 0
    assert control_plane.kubectl("get", "namespace", manifests.BASE_NAMESPACE,
                                 check=False).returncode == 0
    held = custom.get_namespaced_custom_object(rsv.GROUP, rsv.VERSION, manifests.BASE_NAMESPACE,
                                               rsv.PLURAL, "held")
    assert held["spec"]["node"] == "n0"
    gone = control_plane.kubectl("get", "deployment", "gpufrag-scheduler", "-n",
                                 manifests.BASE_NAMESPACE, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def _the_crd_hook_brings_back_the_charts_crd(helm: Path, plane: ControlPlane,
                                             tmp_path: Path) -> None:
    """The pre-upgrade hook's own command, as its own ServiceAccount with its own RBAC, against
    a real API server: a GPUReservation CRD that differs from the chart's (what an older chart
    installed) is the chart's again. (In the install above the Job's pod is completed by the
    harness, not run: this is what its container does.)"""
    crd = f"{rsv.PLURAL}.{rsv.GROUP}"
    plane.kubectl("patch", "crd", crd, "--type=merge", "-p",
                  '{"spec": {"names": {"shortNames": ["oldrsv"]}}}')
    hooks = [d for d in helm_template(helm, "-n", manifests.BASE_NAMESPACE, tests=True)
             if annotations_of(d).get(manifests.HOOK_ANNOTATION) == "pre-upgrade"]
    assert sorted(identity(d)[1] for d in hooks) == [
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job", "ServiceAccount"]
    job = tree(find(hooks, "Job", CRD_HOOK))
    needs = [d for d in hooks if d["kind"] != "Job"]
    plane.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all(needs))
    try:
        # What the Job's volume holds: the ConfigMap's files.
        crds = tmp_path / "crds"
        crds.mkdir()
        for name, text in tree(find(hooks, "ConfigMap", CRD_HOOK))["data"].items():
            (crds / name).write_text(text)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["/bin/kubectl"] and container["args"][-1] == "/crds/"
        token = plane.kubectl("create", "token", CRD_HOOK, "-n",
                              manifests.BASE_NAMESPACE).stdout.strip()
        applied = plane.kubectl(f"--token={token}", *container["args"][:-1], f"{crds}/",
                                check=False)
        assert applied.returncode == 0, applied.stderr
        names = plane.kubectl("get", "crd", crd, "-o", "jsonpath={.spec.names.shortNames}")
        assert names.stdout == '["gpursv"]'
        # The hook's account may change the chart's CRDs and no other.
        other = plane.kubectl(f"--token={token}", "delete", "crd", crd, check=False)
        assert other.returncode != 0 and "forbidden" in other.stderr
    finally:
        plane.kubectl("delete", "-f", "-", input_text=yaml.safe_dump_all(needs), check=False)


def _webhook_certificate(plane: ControlPlane, namespace: str, release: str
                         ) -> tuple[str, str, str]:
    """The webhook Secret's tls.crt and ca.crt as installed, checked against the caBundle the
    API server holds for the release's webhook."""
    secret = yaml.safe_load(plane.kubectl("get", "secret", "gpufrag-admission-tls", "-n",
                                          namespace, "-o", "yaml").stdout)
    webhook = yaml.safe_load(plane.kubectl(
        "get", "mutatingwebhookconfiguration", f"{release}-gpufrag-rightsizing", "-o",
        "yaml").stdout)
    bundles = {w["clientConfig"]["caBundle"] for w in webhook["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    return secret["data"]["tls.crt"], secret["data"]["tls.key"], secret["data"]["ca.crt"]
