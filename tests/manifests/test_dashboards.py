"""The Grafana dashboards (manifests/components/grafana-dashboards): one per component, shipped
by the component's kustomization, and every query one Prometheus parses and that reads only
metrics that exist: exported by a component (as scraped in ``scrapes``), recorded by the
PrometheusRule, or provided by an external source named in ``scrapes.EXTERNAL``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.conftest import DASHBOARDS, MANIFESTS
from tests.manifests.promql import grafana_to_promql, metric_names_in
from tests.manifests.scrapes import EXTERNAL

# Dashboard file -> the component whose metrics it shows.
BOARDS = {"extender.json": "extender", "defrag.json": "defrag", "agent.json": "agent",
          "serving.json": "serving"}
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$")


def load(name: str) -> dict[str, Any]:
    board: dict[str, Any] = json.loads((DASHBOARDS / name).read_text())
    return board


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def test_one_dashboard_per_component_is_shipped() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*.json")) == sorted(BOARDS)
    # The component's ConfigMap, rendered from the chart's template, carries every board.
    (configmap,) = yaml.safe_load_all((MANIFESTS / "components" / "grafana-dashboards"
                                       / "dashboards.yaml").read_text())
    assert configmap["data"] == {f"gpufrag-{name}": (DASHBOARDS / name).read_text()
                                 for name in BOARDS}
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    uids = [load(name)["uid"] for name in BOARDS]
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_panels_query_the_prometheus_data_source_variable(name: str) -> None:
    board = load(name)
    assert board["templating"]["list"][0] == {
        "name": "datasource", "label": "Data source", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0, "refresh": 1}
    graphs = [p for p in panels(board) if p["type"] != "row"]
    assert graphs
    for panel in graphs:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_query_reads_metrics_that_exist(promtool: Path, name: str,
                                              exported_names: dict[str, set[str]],
                                              recorded_names: set[str]) -> None:
    board = load(name)
    known = exported_names[BOARDS[name]] | recorded_names | set(EXTERNAL)
    queries = {f"{p['title']} [{t['refId']}]": t["expr"]
               for p in panels(board) if p["type"] != "row" for t in p["targets"]}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match, variable
            queries[f"${variable['name']}"] = match.group(1)
    unknown = {where: sorted(missing) for where, expr in queries.items()
               if (missing := metric_names_in(promtool, grafana_to_promql(expr)) - known)}
    assert unknown == {}
