"""Who may reach each listener of gpufrag's components, as kustomize and the chart render it:
every TCP port a component listens on outside its pod is covered by a NetworkPolicy that
admits exactly the callers that port has (docs/security.md, "Who may reach what"), the verbs
stay on the pod's loopback where no policy is needed, and the chart's peers follow its values.
The listeners are read from the workloads themselves (their flags and declared ports), so a
listener added without a policy fails here; docs/security.md's table names each of them with
the bounds the code sets.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit import manifests
from devkit.build import build_control_plane
from devkit.toolbuild import build_tool
from gpufrag.httpserve import Limits
from gpufrag.probes import PROBE_DEADLINE_S, PROBE_MAX_CONNECTIONS, PROBE_MAX_HEADER_BYTES
from tests.built import built_or_fail
from tests.e2e.test_helm import REPO, TEST_POD, helm_template

Doc = dict[str, Any]

PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
HELM_TEST = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": TEST_POD}}}
ANY = "any source"  # a rule with no peers (`from: []`)

# Each component's listeners on the pod network, by container port, and who must reach them:
# Prometheus scrapes every /metrics; the chart's `helm test` pod asks the extender's probes;
# the API server calls the webhook (by default from any source: it has no labels to name it).
# The kubelet's probes come from the pod's own node, which no policy blocks.
EXPECTED: dict[tuple[str, int], list[object]] = {
    ("gpufrag-scheduler", 8889): [PROMETHEUS, HELM_TEST],  # the extender's probes, /metrics
    ("gpufrag-scheduler", 10259): [PROMETHEUS],  # kube-scheduler's secure port
    ("gpufrag-agent", 9401): [PROMETHEUS],
    ("gpufrag-device-plugin", 9402): [PROMETHEUS],
    ("gpufrag-dra-plugin", 9403): [PROMETHEUS],
    ("gpufrag-admission", 8443): [PROMETHEUS, ANY],  # /mutate, /healthz, /metrics
}
# The flags by which a component is told where to listen.
PORT_FLAGS = re.compile(r"^--(?:port|metrics-port|set=server\.health_port)=(\d+)$")
HOST_FLAGS = re.compile(r"^--(?:host|set=server\.host)=(\S+)$")


@pytest.fixture(scope="module")
def kubectl() -> list[str]:
    binary = built_or_fail("control plane build", build_control_plane)
    return [str(binary), "kubectl"]


@pytest.fixture(scope="module")
def helm() -> Path:
    return built_or_fail("helm build", lambda: build_tool("helm"))


@pytest.fixture(scope="module")
def kustomized(kubectl: list[str]) -> list[Doc]:
    """The base and the right-sizing (the webhook's) and DRA (the driver's) components, as
    kustomize renders them."""
    docs = []
    for path in (manifests.BASE_DIR, manifests.COMPONENTS_DIR / "rightsizing",
                 manifests.COMPONENTS_DIR / "dra"):
        result = subprocess.run([*kubectl, "kustomize", str(path)], capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        docs += [d for d in yaml.safe_load_all(result.stdout) if d]
    return docs


def _workloads(docs: list[Doc]) -> Iterator[tuple[str, dict[str, str], list[Doc]]]:
    """(name, pod labels, containers) of each of gpufrag's long-running workloads (the
    example model service is a workload of its own, whose callers are its model's)."""
    for doc in docs:
        if (doc["kind"] in ("Deployment", "DaemonSet")
                and doc["metadata"]["name"].startswith("gpufrag-")):
            template = doc["spec"]["template"]
            yield (doc["metadata"]["name"], template["metadata"]["labels"],
                   template["spec"]["containers"])


def _listeners(docs: list[Doc]) -> dict[tuple[str, int], dict[str, str]]:
    """(workload, port) -> the names its pod's containers give their ports, for every port a
    container declares or a flag opens on the pod network; a flag's port on loopback is not
    one (nothing outside the pod reaches it)."""
    found: dict[tuple[str, int], dict[str, str]] = {}
    for name, _, containers in _workloads(docs):
        names = {p["containerPort"]: p.get("name", "") for c in containers
                 for p in c.get("ports", [])}
        for port, port_name in names.items():
            found[(name, port)] = {"name": port_name}
        for container in containers:
            args = container.get("args", [])
            hosts = [m.group(1) for a in args if (m := HOST_FLAGS.match(a))]
            for arg in args:
                m = PORT_FLAGS.match(arg)
                if m is None or (arg.startswith("--port=") and hosts == ["127.0.0.1"]):
                    continue
                port = int(m.group(1))
                assert port in names, f"{name} listens on {port} but declares no such port"
    return found


def _admitted(docs: list[Doc], workload: str, port: int) -> list[object]:
    """The peers every policy selecting ``workload``'s pods admits to ``port`` (ANY for a
    rule without peers), in the policies' order."""
    labels, containers = next((lb, cs) for n, lb, cs in _workloads(docs) if n == workload)
    port_names = {p.get("name"): p["containerPort"] for c in containers
                  for p in c.get("ports", [])}
    peers: list[object] = []
    selected = False
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        selector = policy["spec"]["podSelector"].get("matchLabels", {})
        if any(labels.get(k) != v for k, v in selector.items()):
            continue
        assert "Ingress" in policy["spec"]["policyTypes"]
        selected = True
        for rule in policy["spec"].get("ingress", []):
            ports = [port_names.get(p["port"], p["port"]) for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            peers += rule.get("from") or [ANY]
    assert selected, f"no NetworkPolicy selects the pods of {workload}"
    return peers


def _check(docs: list[Doc], expected: dict[tuple[str, int], list[object]]) -> None:
    listeners = _listeners(docs)
    assert sorted(listeners) == sorted(expected), "the listeners, and those with callers"
    for (workload, port), peers in expected.items():
        admitted = _admitted(docs, workload, port)
        assert sorted(map(json.dumps, admitted)) == sorted(map(json.dumps, peers)), (
            f"{workload} port {port} ({listeners[(workload, port)]['name']})")


def test_the_verbs_listen_on_the_pods_loopback_only(kustomized: list[Doc]) -> None:
    (extender,) = [c for name, _, cs in _workloads(kustomized) if name == "gpufrag-scheduler"
                   for c in cs if c["name"] == "extender"]
    assert "--host=127.0.0.1" in extender["args"] and "--port=8888" in extender["args"]
    assert 8888 not in {p["containerPort"] for p in extender["ports"]}


def test_kustomize_admits_only_each_listeners_callers(kustomized: list[Doc]) -> None:
    _check(kustomized, EXPECTED)


def test_the_chart_admits_only_each_listeners_callers(helm: Path) -> None:
    _check(helm_template(helm, "--set", "rightsizing.enabled=true", "--set", "dra.enabled=true"),
           EXPECTED)


def test_the_charts_peers_are_its_values(helm: Path, tmp_path: Path) -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
               "podSelector": {"matchLabels": {"app": "vmagent"}}}
    control_plane = {"ipBlock": {"cidr": "10.0.0.0/28"}}
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "rightsizing": {"enabled": True}, "dra": {"enabled": True},
        "networkPolicy": {"prometheus": [scraper], "apiServer": [control_plane]}}))
    expected = {key: [scraper if p == PROMETHEUS else control_plane if p == ANY else p
                      for p in peers] for key, peers in EXPECTED.items()}
    _check(helm_template(helm, "-f", str(values)), expected)


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table after ``heading``."""
    lines = text.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_security_docs_table_names_every_listener_and_its_bounds() -> None:
    rows = _table((REPO / "docs" / "security.md").read_text(), "### Who may reach what")
    listeners = {row[1]: row for row in rows}
    for _, port in EXPECTED:
        assert any(f", {port}" in cell for cell in listeners), f"port {port} not in the table"
    assert any(", 8888 (" in cell for cell in listeners)  # the verbs, on loopback
    probe = (f"{PROBE_MAX_CONNECTIONS} connections, {PROBE_MAX_HEADER_BYTES // 1024} KiB "
             f"headers in {PROBE_DEADLINE_S:g} s")
    limits = Limits()
    listener = (f"{limits.max_connections} connections, {limits.max_header_bytes // 1024} KiB "
                "headers")
    for cell, row in listeners.items():
        if cell.startswith(("probes", "debug")):
            assert row[-1] == probe, row
        elif cell.startswith("verbs"):
            assert row[-1] == f"{listener} in `server.read_timeout_s`", row
        elif cell.startswith("HTTPS"):
            assert row[-1] == f"{listener} in {limits.header_timeout_s:g} s", row
