"""The PrometheusRule (manifests/components/prometheus-operator/rules.yaml) under promtool.

``promtool check rules`` (with every lint, fatal) on its groups, and ``promtool test rules`` on
rules_test.yaml, which holds, for every rule, series that make it fire or cross its threshold
and series that do not. Two further checks keep the two files and the components together:
every rule has its tests (an alert: at least one case firing and one not), and every metric a
rule reads is one a component exports (or another rule records, or an external source named in
``scrapes.EXTERNAL`` provides), so renaming a metric breaks this test rather than an alert.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.conftest import OPERATOR
from tests.manifests.promql import metric_names_in
from tests.manifests.scrapes import EXTERNAL

UNIT_TESTS = Path(__file__).resolve().parent / "rules_test.yaml"


@pytest.fixture
def rule_file(tmp_path: Path, rule_groups: list[dict[str, Any]]) -> Path:
    """The PrometheusRule's groups as a rule file, next to a copy of the unit tests."""
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return path


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, check=False)


def test_the_component_ships_the_rules() -> None:
    kustomization = yaml.safe_load((OPERATOR / "kustomization.yaml").read_text())
    assert "rules.yaml" in kustomization["resources"]


def test_promtool_check_rules(promtool: Path, rule_file: Path) -> None:
    result = _promtool(promtool, "check", "rules", "--lint=all", "--lint-fatal", rule_file.name,
                       cwd=rule_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_test_rules(promtool: Path, rule_file: Path) -> None:
    result = _promtool(promtool, "test", "rules", "--diff", UNIT_TESTS.name,
                       cwd=rule_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_is_tested_firing_and_not(rule_groups: list[dict[str, Any]]) -> None:
    tests = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    records = {r["record"] for g in rule_groups for r in g["rules"] if "record" in r}
    alerts = {r["alert"] for g in rule_groups for r in g["rules"] if "alert" in r}
    firing: set[str] = set()
    quiet: set[str] = set()
    exprs: list[str] = []
    for case in tests:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
        exprs += [check["expr"] for check in case.get("promql_expr_test", [])]
    read = {name for expr in exprs
            for name in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if name in records}
    assert records - read == set(), "recording rules no promql_expr_test reads"
    assert alerts - firing == set(), "alerts no test shows firing"
    assert alerts - quiet == set(), "alerts no test shows not firing"
    assert (firing | quiet) - alerts == set(), "tests of alerts that do not exist"


def test_rules_read_only_metrics_that_exist(promtool: Path, rule_groups: list[dict[str, Any]],
                                            exported_names: dict[str, set[str]],
                                            recorded_names: set[str]) -> None:
    known = set().union(*exported_names.values()) | recorded_names | set(EXTERNAL)
    unknown = {}
    for group in rule_groups:
        for rule in group["rules"]:
            missing = metric_names_in(promtool, rule["expr"]) - known
            if missing:
                unknown[rule.get("record") or rule["alert"]] = sorted(missing)
    assert unknown == {}
