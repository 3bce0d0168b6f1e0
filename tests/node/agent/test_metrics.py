from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage
from gpufrag.nvml import MIB
from node.agent.metrics import AgentMetrics, Health, respond, start_http_server
from tests.node.agent.fakes import POD_A, POD_B, FakeClock

GPU0 = GpuUsage(index=0, uuid="GPU-aaaa", product="NVIDIA A100-SXM4-80GB", memory_used_mib=30_512,
                memory_total_mib=81_920, utilization_pct=63,
                pods=(PodGpuUsage(POD_A.namespace, POD_A.name, POD_A.uid, 20_000),
                      PodGpuUsage(POD_B.namespace, POD_B.name, POD_B.uid, 10_000)))
GPU1 = GpuUsage(index=1, uuid="GPU-bbbb", product="NVIDIA A100-SXM4-80GB", memory_used_mib=0,
                memory_total_mib=81_920, utilization_pct=0)


def usage(*gpus: GpuUsage) -> NodeGpuUsage:
    return NodeGpuUsage(node="node1", timestamp=0.0, interval_s=15.0, gpus=gpus)


def value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    result: float | None = metrics.registry.get_sample_value(name, labels)
    return result


def gpu_labels(index: int, uuid: str) -> dict[str, str]:
    return {"gpu": str(index), "UUID": uuid, "modelName": "NVIDIA A100-SXM4-80GB",
            "Hostname": "node1"}


def test_dcgm_named_gpu_series() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0, GPU1))
    labels = gpu_labels(0, "GPU-aaaa")
    assert value(metrics, "DCGM_FI_DEV_FB_USED", **labels) == 30_512
    assert value(metrics, "DCGM_FI_DEV_FB_FREE", **labels) == 81_920 - 30_512
    assert value(metrics, "DCGM_FI_DEV_GPU_UTIL", **labels) == 63
    assert value(metrics, "DCGM_FI_DEV_FB_FREE", **gpu_labels(1, "GPU-bbbb")) == 81_920


def test_per_pod_series_in_bytes_and_removal_of_pods_that_left() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0))
    name = "gpufrag_pod_gpu_memory_used_bytes"
    pod_b = {"namespace": "serving", "pod": POD_B.name, "node": "node1", "gpu": "0"}
    assert value(metrics, name, **pod_b) == 10_000 * MIB
    metrics.observe_usage(usage(replace(GPU0, memory_used_mib=20_512, pods=GPU0.pods[:1])))
    assert value(metrics, name, **pod_b) is None
    assert value(metrics, name, namespace="serving", pod=POD_A.name, node="node1",
                 gpu="0") == 20_000 * MIB


def test_dcgm_families_carry_dcgms_labels_and_the_agents_own_are_snake_case() -> None:
    # The DCGM_ families mirror dcgm-exporter's, camelCase modelName included, so its
    # dashboards work unchanged; gpufrag's own families use Prometheus's snake_case.
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0))
    metrics.observe_leaks([POD_A], frozenset())
    dcgm, own = set(), set()
    for family in metrics.registry.collect():
        for sample in family.samples:
            (dcgm if family.name.startswith("DCGM_") else own).update(sample.labels)
    assert dcgm == {"gpu", "UUID", "modelName", "Hostname"}
    assert own == {"namespace", "pod", "node", "gpu", "reason"}


def test_series_of_a_vanished_gpu_are_removed() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0, GPU1))
    metrics.observe_usage(usage(GPU0))
    assert value(metrics, "DCGM_FI_DEV_FB_USED", **gpu_labels(1, "GPU-bbbb")) is None
    assert value(metrics, "DCGM_FI_DEV_FB_USED", **gpu_labels(0, "GPU-aaaa")) == 30_512


def test_leak_gauge_is_0_or_1_per_pod_and_dropped_when_the_pod_leaves() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_leaks([POD_A, POD_B], frozenset({POD_A}))
    name = "gpufrag_agent_gpu_memory_leak_suspected"
    assert value(metrics, name, namespace="serving", pod=POD_A.name) == 1
    assert value(metrics, name, namespace="serving", pod=POD_B.name) == 0
    metrics.observe_leaks([POD_B], frozenset())
    assert value(metrics, name, namespace="serving", pod=POD_A.name) is None


def test_own_registry_never_the_global_one() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0))
    assert REGISTRY.get_sample_value("DCGM_FI_DEV_FB_USED", gpu_labels(0, "GPU-aaaa")) is None
    AgentMetrics("node1")  # a second instance does not collide


def test_health_is_live_until_the_loop_stalls_and_ready_once_marked() -> None:
    clock = FakeClock(100.0)
    health = Health(clock, stall_after_s=60.0)
    assert health.live() and not health.ready  # starting up
    health.mark_tick(100.0)
    clock.advance(60.0)
    assert health.live()
    clock.advance(0.1)
    assert not health.live()
    health.mark_ready()
    assert health.ready


@pytest.mark.parametrize(("path", "ready", "status", "body"), [
    ("/healthz", False, 200, b"ok\n"),
    ("/readyz", False, 503, b"not ready: no reading published yet\n"),
    ("/readyz", True, 200, b"ready\n"),
    ("/readyz?verbose", True, 200, b"ready\n"),
    ("/nope", True, 404, b"not found: try /metrics, /healthz, /readyz\n"),
])
def test_routes(path: str, ready: bool, status: int, body: bytes) -> None:
    health = Health(FakeClock(), stall_after_s=60.0)
    if ready:
        health.mark_ready()
    assert respond(path, AgentMetrics("node1"), health)[0::2] == (status, body)


def test_http_server_serves_metrics_and_probes() -> None:
    metrics = AgentMetrics("node1")
    metrics.observe_usage(usage(GPU0))
    health = Health(FakeClock(), stall_after_s=60.0)
    server = start_http_server(0, metrics, health, host="127.0.0.1")
    base = f"http://127.0.0.1:{server.port}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as reply:
            text = reply.read().decode()
            assert reply.headers["Content-Type"].startswith("text/plain")
        assert 'DCGM_FI_DEV_FB_USED{Hostname="node1",UUID="GPU-aaaa",gpu="0"' in text
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert caught.value.code == 503
        caught.value.close()
    finally:
        server.stop()
