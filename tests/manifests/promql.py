"""The metric names a PromQL expression reads, found by Prometheus's own parser.

``promtool promql label-matchers set`` (an experimental promtool command) parses the expression
and rewrites every vector selector in it with one more matcher; the selectors are then the
names in front of that matcher. Grafana's variables are replaced first with values of the same
type, so a dashboard's query parses as Prometheus would receive it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

MARK = "gpufrag_selector_probe"
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\{[^{}]*" + MARK + '="1"')
# Grafana's built-in interval variables -> durations; other $variables sit in label values.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def grafana_to_promql(expr: str) -> str:
    for variable, duration in GRAFANA_DURATIONS.items():
        expr = expr.replace(variable, duration)
    return expr


def metric_names_in(promtool: Path, expr: str) -> set[str]:
    """The names of every vector selector in ``expr``; a parse error fails with promtool's."""
    result = subprocess.run([str(promtool), "--experimental", "promql", "label-matchers", "set",
                             expr, MARK, "1"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 0, f"{expr!r} does not parse: {result.stderr.strip()}"
    names = set(_SELECTOR.findall(result.stdout))
    assert names, f"{expr!r} reads no metric"
    return names
