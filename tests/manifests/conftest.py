"""Fixtures for the manifest tests: promtool, helm and kubectl (built, cached), each
component's metrics as it exports them, and the PrometheusRule's groups.

A failed promtool build FAILS the tests that need it, with the build's output: a rule test that
skips without its tool would pass while testing nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.build import build_control_plane
from devkit.toolbuild import build_tool
from tests.built import built_or_fail
from tests.manifests import scrapes

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
OPERATOR = MANIFESTS / "components" / "prometheus-operator"
# The dashboards' JSON: the chart reads them (.Files), the component is rendered from it.
DASHBOARDS = ROOT / "charts" / "gpufrag" / "dashboards"


@pytest.fixture(scope="session")
def promtool() -> Path:
    return built_or_fail("promtool build", lambda: build_tool("promtool"))


@pytest.fixture(scope="session")
def helm() -> Path:
    return built_or_fail("helm build", lambda: build_tool("helm"))


@pytest.fixture(scope="session")
def kubectl() -> list[str]:
    """The control plane's kubectl, as a command (its kustomize renders the manifests)."""
    binary = built_or_fail("control plane build", build_control_plane)
    return [str(binary), "kubectl"]


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Component -> its metrics in the text exposition format."""
    return {
        "extender": scrapes.extender_metrics(),
        "agent": scrapes.agent_metrics(tmp_path_factory.mktemp("proc")),
        "deviceplugin": scrapes.deviceplugin_metrics(),
        "serving": scrapes.serving_metrics(),
        "defrag": scrapes.defrag_metrics(),
        "admission": scrapes.admission_metrics(),
    }


@pytest.fixture(scope="session")
def exported_names(exports: dict[str, str]) -> dict[str, set[str]]:
    return {component: scrapes.metric_names(text) for component, text in exports.items()}


@pytest.fixture(scope="session")
def rule_groups() -> list[dict[str, Any]]:
    """The groups of the PrometheusRule, as a Prometheus rule file holds them."""
    (rule,) = [d for d in yaml.safe_load_all((OPERATOR / "rules.yaml").read_text()) if d]
    assert rule["kind"] == "PrometheusRule"
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


@pytest.fixture(scope="session")
def recorded_names(rule_groups: list[dict[str, Any]]) -> set[str]:
    return {r["record"] for g in rule_groups for r in g["rules"] if "record" in r}
