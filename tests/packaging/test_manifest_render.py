"""devkit/manifests.py's pure parts: where each chart file's objects go, and what of Helm's is
taken off them. The render itself, against the committed manifests: tests/e2e/test_helm.py."""

from __future__ import annotations

import pytest

from devkit import manifests
from devkit.manifests import BASE_DIR, COMPONENTS_DIR, RenderError


@pytest.mark.parametrize(("source", "path"), [
    ("templates/rbac-agent.yaml", BASE_DIR / "rbac-agent.yaml"),
    ("crds/crd-gpureservation.yaml", BASE_DIR / "crd-gpureservation.yaml"),
    ("templates/rightsizing/admission-webhook.yaml",
     COMPONENTS_DIR / "rightsizing" / "admission-webhook.yaml"),
    ("templates/tests/pod-gpufrag-test-extender-answers.yaml", None),
    ("templates/crd-upgrade/job-gpufrag-crd-upgrade.yaml", None),
])
def test_each_chart_file_renders_one_manifest_file(source: str, path: object) -> None:
    assert manifests.manifest_path(source) == path


def test_a_template_in_no_components_folder_is_refused() -> None:
    with pytest.raises(RenderError, match="templates/nowhere/x.yaml"):
        manifests.manifest_path("templates/nowhere/x.yaml")


NAMESPACE = """\
# Why it is privileged.
apiVersion: v1
kind: Namespace
metadata:
  labels:
    helm.sh/chart: "gpufrag-0.1.0"
    app.kubernetes.io/instance: "gpufrag"
    app.kubernetes.io/managed-by: "Helm"
    app.kubernetes.io/version: "0.1.0"
    app.kubernetes.io/name: gpufrag
  name: "gpufrag-system"
  annotations:
    helm.sh/resource-policy: keep
"""


def test_helms_labels_and_keep_policy_are_taken_off_and_the_rest_kept() -> None:
    assert manifests.without_helm_metadata(NAMESPACE) == """\
# Why it is privileged.
apiVersion: v1
kind: Namespace
metadata:
  labels:
    app.kubernetes.io/name: gpufrag
  name: "gpufrag-system"
"""


def test_a_label_helm_wrote_another_way_is_refused_not_kept() -> None:
    flow = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  labels: {helm.sh/chart: a}\n"
    with pytest.raises(RenderError, match="helm.sh/chart"):
        manifests.without_helm_metadata(flow)


def test_helms_output_is_split_by_source_and_hooks_left_out() -> None:
    rendered = """\
---
# Source: gpufrag/templates/names.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: a
---
# Source: gpufrag/templates/names.yaml
apiVersion: v1
kind: ConfigMap
metadata:
  name: b
---
# Source: gpufrag/templates/scheduler-pdb/scheduler-pdb.yaml
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: c
---
# Source: gpufrag/templates/tests/pod.yaml
apiVersion: v1
kind: Pod
metadata:
  name: d
"""
    base = manifests.split(rendered, BASE_DIR)
    assert list(base) == [BASE_DIR / "names.yaml"]
    assert [text.split("name: ")[1] for text in base[BASE_DIR / "names.yaml"]] == ["a\n", "b\n"]
    assert list(manifests.split(rendered, COMPONENTS_DIR)) == [
        COMPONENTS_DIR / "scheduler-pdb" / "scheduler-pdb.yaml"]
