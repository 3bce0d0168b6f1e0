"""Every component's metrics follow Prometheus's conventions, checked on what it exports.

``promtool check metrics`` (the client libraries' promlint: snake_case names and label names,
``_total`` counters, base units among the units it knows, help text) on each component's
exposition, and a stricter check of units promlint does not know (MiB, GiB, ms). The DCGM-named
series of the agent are DCGM's, units included (``DCGM_FI_DEV_FB_USED`` is MiB by definition),
and are left out of the unit check only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufrag.nvml import GpuReading
from serving.metrics import ServingMetrics

COMPONENTS = ("extender", "agent", "deviceplugin", "serving", "defrag", "admission")
# The one promlint finding allowed, and only on the DCGM_ families the agent mirrors from
# dcgm-exporter: its camelCase modelName label, kept so dcgm-exporter's dashboards work.
DCGM_CAMEL_CASE = "label names should be written in 'snake_case' not 'camelCase'"
NON_BASE_UNITS = {"kib", "mib", "gib", "kb", "mb", "gb", "ms", "us", "ns", "minutes", "hours",
                  "days", "pct", "percent"}


@pytest.mark.parametrize("component", COMPONENTS)
def test_promtool_check_metrics(promtool: Path, exports: dict[str, str], component: str) -> None:
    result = subprocess.run([str(promtool), "check", "metrics"], input=exports[component],
                            capture_output=True, text=True, timeout=60, check=False)
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    allowed = [f for f in findings if f.startswith("DCGM_") and f.endswith(DCGM_CAMEL_CASE)]
    assert findings == allowed, findings
    assert result.returncode == (3 if allowed else 0)  # promtool's exit code for lint findings


@pytest.mark.parametrize("component", [
    *COMPONENTS,
])
def test_units_are_base_units(exported_names: dict[str, set[str]], component: str) -> None:
    offending = {name for name in exported_names[component] if not name.startswith("DCGM_")
                 and NON_BASE_UNITS & set(name.split("_"))}
    assert offending == set()


def test_dcgm_families_keep_dcgms_labels_and_gpufrags_own_are_snake_case(
        exports: dict[str, str]) -> None:
    for component in ("agent", "deviceplugin"):
        for family in text_string_to_metric_families(exports[component]):
            labels = {label for sample in family.samples for label in sample.labels}
            if family.name.startswith("DCGM_"):
                assert labels == {"gpu", "UUID", "modelName", "Hostname"}, family.name
            else:
                assert "modelName" not in labels, family.name


def _growth_batches(metrics: ServingMetrics | str) -> list[float]:
    text = metrics if isinstance(metrics, str) else metrics.render().decode()
    return [s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "gpufrag_serving_gpu_memory_growth_batches_total"]


def test_gpu_memory_growth_across_a_batch_is_counted_from_0(exports: dict[str, str]) -> None:
    metrics = ServingMetrics(model="m")
    assert _growth_batches(metrics) == []  # no GPU, no GPU series
    metrics.add_gpu_collector(EmptyProbe())
    # From 0 once there is a GPU, so the alert's increase() sees the first such batch.
    assert _growth_batches(metrics) == [0]
    # The recording grows GPU 1 by 300 MiB across the second batch (threshold 100 MiB).
    assert _growth_batches(exports["serving"]) == [1]


class EmptyProbe:
    def read(self) -> list[GpuReading]:
        return []
