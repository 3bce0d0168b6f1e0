"""Where every component's Prometheus registry comes from: one home for how gpufrag exports.

``prometheus_client`` adds a ``<name>_created`` gauge (the Unix time a counter, histogram or
summary was made) beside every such family. dcgm-exporter and the kubelet do not, it doubles
the series of every counter for a figure no dashboard or alert here reads, and promtool flags
the families. :func:`new_registry` switches them off for the process (the library's public
``disable_created_metrics``) before it hands out a registry, so no component can export them.
"""

from __future__ import annotations

import prometheus_client


def new_registry() -> prometheus_client.CollectorRegistry:
    """A fresh registry whose counters, histograms and summaries carry no ``_created``."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream
    return prometheus_client.CollectorRegistry()
