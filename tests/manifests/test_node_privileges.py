"""What the manifests let gpufrag's node-side components do, as kustomize and the chart render it:
the node-write policies follow the chart's namespace and release names, and the opt-in MIG
monitor component (manifests/components/mig-monitor, helm agent.migMonitor) adds exactly the
toolkit's variable and SYS_ADMIN to the agent, nothing else, and only when asked. The policies'
behaviour on a real API server: tests/e2e/test_node_write_policy.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devkit import manifests
from tests.e2e.test_helm import BASE, find, helm_template, same_objects

MIG_VALUES = manifests.set_flags(manifests.PATCH_PARTS["mig-monitor"])
MONITOR_ENV = {"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"}


def kustomize(kubectl: list[str], path: Path) -> list[dict[str, Any]]:
    result = subprocess.run([*kubectl, "kustomize", str(path)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def with_mig_monitor(kubectl: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """The base with components/mig-monitor, as an overlay names them (by relative path)."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(manifests.BASE_DIR, tmp_path)],
        "components": [os.path.relpath(manifests.COMPONENTS_DIR / "mig-monitor", tmp_path)]}))
    return kustomize(kubectl, tmp_path)


def agent_container(docs: list[dict[str, object]]) -> Any:
    daemonset: Any = find(docs, "DaemonSet", "gpufrag-agent")
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "agent"]
    return container


def test_the_policies_name_the_releases_namespace_and_policies(helm: Path) -> None:
    docs = helm_template(helm, "-n", "gpu-team", release="other")
    policies: Any = {d["metadata"]["name"]: d for d in docs  # type: ignore[index]
                     if d["kind"] == "ValidatingAdmissionPolicy"}
    assert sorted(policies) == ["other-gpufrag-agent-node-writes",
                                "other-gpufrag-defrag-node-writes",
                                "other-gpufrag-device-plugin-pod-writes",
                                "other-gpufrag-pod-records"]
    for account, policy in (("agent", "agent-node-writes"), ("defrag", "defrag-node-writes"),
                            ("device-plugin", "device-plugin-pod-writes")):
        (condition,) = policies[f"other-gpufrag-{policy}"]["spec"]["matchConditions"]
        assert condition["expression"] == (
            f"request.userInfo.username == 'system:serviceaccount:gpu-team:gpufrag-{account}'")
    (plugin,) = [v for v in policies["other-gpufrag-pod-records"]["spec"]["variables"]
                 if v["name"] == "devicePlugin"]
    assert plugin["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:gpu-team:gpufrag-device-plugin'")
    bindings: Any = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    assert all(b["metadata"]["name"] == b["spec"]["policyName"] for b in bindings)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # Off with their component; the pod-record policy guards every component's books.
    off = helm_template(helm, "--set", "defrag.enabled=false", "--set", "agent.enabled=false",
                        "--set", "devicePlugin.enabled=false")
    assert sorted(d["metadata"]["name"] for d in off  # type: ignore[index]
                  if "AdmissionPolicy" in str(d["kind"])) == ["gpufrag-pod-records"] * 2


def test_the_mig_monitor_adds_the_toolkits_variable_and_sys_admin_only(
        kubectl: list[str], tmp_path: Path) -> None:
    base = kustomize(kubectl, manifests.BASE_DIR)
    with_monitor = with_mig_monitor(kubectl, tmp_path)
    before, after = agent_container(base), agent_container(with_monitor)
    assert after["env"] == [*before["env"], MONITOR_ENV]
    # The toolkit refuses monitoring with single MIG devices visible: the agent sees all GPUs.
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in after["env"]
    assert after["securityContext"] == before["securityContext"] | {
        "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    # Still no root, no escalation: SYS_ADMIN stays in the bounding set, where the toolkit looks.
    pod = find(with_monitor, "DaemonSet", "gpufrag-agent")["spec"]["template"]["spec"]  # type: ignore[index]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert after["securityContext"]["allowPrivilegeEscalation"] is False
    after["env"], after["securityContext"] = before["env"], before["securityContext"]
    assert with_monitor == base, "the component changes more than the agent's env and capabilities"


def test_helm_renders_the_mig_monitor_exactly_as_kustomize(helm: Path, kubectl: list[str],
                                                           tmp_path: Path) -> None:
    """The component is hand-written kustomize patches on the rendered base; the chart's value
    renders exactly the base with it."""
    same_objects(helm_template(helm, *BASE, *MIG_VALUES), with_mig_monitor(kubectl, tmp_path))
    default = agent_container(helm_template(helm))
    assert MONITOR_ENV not in default["env"]
    assert "add" not in default["securityContext"]["capabilities"]
