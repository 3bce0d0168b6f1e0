"""charts/gpufrag against the kustomize base, helm itself and the real API server.

The chart is generated from ``manifests/base`` by ``devkit/chart.py``; these tests hold it to
that: the committed chart is what the generator writes today (so a changed base fails here until
the chart is regenerated), ``helm template`` with default values renders exactly the objects
``kubectl kustomize manifests/base`` renders, ``helm lint --strict`` passes, the values reach the
objects they name, bad values are refused naming the field, and every rendered object is
accepted by a server-side dry run. helm is built from its Go module (``devkit/tools/helm``).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import kubernetes
import pytest
import yaml

from devkit import chart
from devkit.build import BuildError
from devkit.controlplane import ControlPlane
from devkit.toolbuild import build_tool
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


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return build_tool("helm")
    except BuildError as e:
        failure = str(e)
    pytest.fail(f"helm build failed:\n{failure}", pytrace=False)


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120,
                            check=False)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stderr}"
    return result


def helm_template(helm: Path, *args: str) -> list[Doc]:
    """What an install applies: the templates and crds/ (which Helm installs first)."""
    out = run_helm(helm, "template", "gpufrag", str(CHART), "--include-crds", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def without_keep(doc: Doc) -> Doc:
    """``doc`` without Helm's keep policy, the one thing the chart adds to the base (on the
    Namespace, which uninstall must not delete)."""
    meta = doc.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict) or chart.KEEP_ANNOTATION not in annotations:
        return doc
    rest = {k: v for k, v in annotations.items() if k != chart.KEEP_ANNOTATION}
    meta = {k: v for k, v in meta.items() if k != "annotations"} | (  # type: ignore[union-attr]
        {"annotations": rest} if rest else {})
    return {**doc, "metadata": meta}


def kustomize(binary: Path, path: str) -> list[Doc]:
    return chart.render_base([str(binary), "kubectl"], MANIFESTS / path)


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
    result = plane.kubectl("apply", "--dry-run=server", "-f", "-",
                           input_text=yaml.safe_dump_all(docs), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)


def ensure_namespace(plane: ControlPlane, name: str) -> None:
    # A dry-run Namespace is not persisted, so namespaced objects need the real one.
    if plane.kubectl("get", "namespace", name, check=False).returncode != 0:
        plane.kubectl("create", "namespace", name)


# --------------------------------------------------------------------------------------------


def test_chart_is_generated_from_the_current_base(control_plane_binary: Path) -> None:
    files = chart.build_chart(kustomize(control_plane_binary, "base"), chart.project_version())
    stale = chart.stale_files(files)
    assert not stale, (f"charts/gpufrag is not what manifests/base gives: {', '.join(stale)}; "
                       f"run `{chart.REGENERATE}`")


def test_default_values_render_exactly_the_kustomize_base(helm: Path,
                                                          control_plane_binary: Path) -> None:
    rendered = by_identity(helm_template(helm))
    base = by_identity(kustomize(control_plane_binary, "base"))
    assert sorted(rendered) == sorted(base)
    differ = [key for key in base if without_keep(rendered[key]) != base[key]]
    assert not differ, f"objects that differ from the base: {differ}"
    kept = [key[1] for key, doc in rendered.items() if doc != without_keep(doc)]
    assert kept == ["Namespace"]


def test_helm_lint_strict_passes(helm: Path) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_kustomize_image_is_fully_qualified(control_plane_binary: Path, path: str) -> None:
    refs = images(kustomize(control_plane_binary, path))
    assert [r for r in refs if not chart.has_registry_host(r)] == []


def test_every_chart_image_is_fully_qualified(helm: Path) -> None:
    refs = images(helm_template(helm))
    assert refs and [r for r in refs if not chart.has_registry_host(r)] == []
    assert "registry.k8s.io/kube-scheduler:v1.36.3" in refs


AWKWARD = {
    "alert": "{{ $labels.pod }} uses {{ $value | humanizePercentage }} of its GPU",
    "dashboard": '{\n  "legendFormat": "{{pod}} / {{gpu}}",\n  "expr": "sum(x{a=\\"b\\"})"\n}',
    "quotes": "say \"hi\" \\ and 'single' and a tab\there",
    "unicode": "GPU → 80 % ✓",
    "looks-typed": "true",
    "version": "0.1.0",
    "cron": "*/15 * * * *",
    "empty": "",
    "two-newlines": "a\nb\n\n",
    "trailing-blank": "line with blanks   \nnext\n",
    "namespace-flag": "--namespace=gpufrag-system --x",
    "namespace-file": "namespace: gpufrag-system\nrule: {{ $labels.namespace }}\n",
}


def test_generated_templates_render_back_to_their_base_through_helm(helm: Path,
                                                                   tmp_path: Path) -> None:
    docs: list[Doc] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "awkward", "namespace": chart.BASE_NAMESPACE}, "data": AWKWARD},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "knobs", "namespace": chart.BASE_NAMESPACE},
         "data": {"args": "exec run --threshold=0.25 --budget=10 \"$X\"",
                  "file": "a: {{ keep }}\nweight: 200\nflag: true\n"}},
    ]
    knobs = (
        chart.Knob("t.threshold", "ConfigMap", "knobs", "data/args", "",
                   pattern=r"--threshold=(\S+)"),
        chart.Knob("t.budget", "ConfigMap", "knobs", "data/args", "", pattern=r"--budget=(\d+)"),
        chart.Knob("t.weight", "ConfigMap", "knobs", "data/file", "", pattern=r"weight: (\d+)"),
        chart.Knob("t.flag", "ConfigMap", "knobs", "data/file", "", pattern=r"flag: (\w+)"),
    )
    chart.write_chart(chart.build_chart(docs, "0.1.0", knobs=knobs, toggles=()), tmp_path)
    out = run_helm(helm, "template", "t", str(tmp_path)).stdout
    assert by_identity([d for d in yaml.safe_load_all(out) if d]) == by_identity(docs)
    out = run_helm(helm, "template", "t", str(tmp_path), "--set", "t.threshold=0.5",
                   "--set", "t.weight=7", "--set", "namespace.name=elsewhere").stdout
    rendered = {identity(d)[3]: d for d in yaml.safe_load_all(out) if d}
    assert rendered["knobs"]["data"] == {
        "args": 'exec run --threshold=0.5 --budget=10 "$X"',
        "file": "a: {{ keep }}\nweight: 7\nflag: true\n"}
    assert rendered["awkward"]["data"]["namespace-flag"] == "--namespace=elsewhere --x"
    assert rendered["awkward"]["data"]["namespace-file"] == (
        "namespace: elsewhere\nrule: {{ $labels.namespace }}\n")


def test_default_chart_is_accepted_by_the_api_server(helm: Path,
                                                     control_plane: ControlPlane) -> None:
    ensure_namespace(control_plane, chart.BASE_NAMESPACE)
    dry_run(control_plane, helm_template(helm))


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
    assert chart.BASE_NAMESPACE not in yaml.safe_dump_all(docs)
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


def test_chart_installs_into_an_existing_release_namespace(helm: Path) -> None:
    docs = helm_template(helm, "--namespace", "ml-platform", "--set", "namespace.create=false",
                         "--set", "namespace.name=")
    assert "Namespace" not in {identity(d)[1] for d in docs}
    assert {identity(d)[2] for d in docs if identity(d)[1] == "Deployment"} == {"ml-platform"}


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


def test_uninstall_keeps_the_crd_the_reservations_and_the_namespace(
        helm: Path, control_plane_binary: Path) -> None:
    """``helm install`` then ``helm uninstall`` on a real API server of its own (the chart's
    cluster-wide names would collide with objects other tests applied): the GPUReservation CRD
    (in crds/), a live reservation and the gpufrag-system Namespace (kept by policy) are all
    still there, so no reservation is lost; the release's other objects are gone."""
    with ControlPlane(control_plane_binary) as plane:
        _install_and_uninstall(helm, plane)


def _install_and_uninstall(helm: Path, control_plane: ControlPlane) -> None:
    kubeconfig = str(control_plane.kubeconfig_path)
    release = "keep-test"
    run_helm(helm, "install", release, str(CHART), "--kubeconfig", kubeconfig,
             "--namespace", "default")
    custom = kubernetes.client.CustomObjectsApi(control_plane.api_client())
    try:
        custom.create_namespaced_custom_object(
            rsv.GROUP, rsv.VERSION, chart.BASE_NAMESPACE, rsv.PLURAL, rsv.body(Reservation(
                name="held", node="n0", gpus=(0,), gpu_milli=300, owner_uid="rs-1",
                namespace="default", expires=time.time() + 300)))
    finally:
        run_helm(helm, "uninstall", release, "--kubeconfig", kubeconfig, "--namespace",
                 "default")
    assert control_plane.kubectl("get", "crd", f"{rsv.PLURAL}.{rsv.GROUP}",
                                 check=False).returncode == 0
    assert control_plane.kubectl("get", "namespace", chart.BASE_NAMESPACE,
                                 check=False).returncode == 0
    held = custom.get_namespaced_custom_object(rsv.GROUP, rsv.VERSION, chart.BASE_NAMESPACE,
                                               rsv.PLURAL, "held")
    assert held["spec"]["node"] == "n0"
    gone = control_plane.kubectl("get", "deployment", "gpufrag-scheduler", "-n",
                                 chart.BASE_NAMESPACE, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
