"""What each gpufrag component exports to Prometheus, produced by the component's own code.

- the extender: ``/metrics`` of the extender app (snapshot mode, Flask's test client), after a
  filter, a prioritize and a bad request, plus the collector of Warning Events that a live
  cluster adds;
- the node agent: a real scrape over HTTP of ``gpufrag agent`` running on recorded NVML
  (the agent's test fakes: two A100s, two pods found through their cgroups);
- serving: the runtime's registry on a recorded 2 x H100 probe, after batches, outcomes, a
  model load and a batch that grew GPU memory by 300 MiB (counted by MemoryGrowthWatch);
- the device plugin: its registry after a health report, a registration and an allocation;
- defrag: one cycle's registry, as ``--pushgateway`` pushes it;
- the right-sizing webhook: its registry after a rewrite and a skip, as ``/metrics`` serves it.

Used by the promtool lint of every component and by the dashboard and rule tests, which may
name only metrics that appear here (or that the rules record, or that the few external sources
in :data:`EXTERNAL` provide).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from defrag.admission.mutate import SKIP_REASONS
from defrag.admission.review import AdmissionMetrics
from defrag.controller.measure import Summary
from defrag.controller.metrics import CycleMetrics
from gpufrag.nvml import NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from node.agent import cli as agent_cli
from node.agent.cgroup import PodRecord
from node.deviceplugin.metrics import PluginMetrics
from node.gpus import Gpu
from scheduler.extender.metrics import ExtenderMetrics, SkipEventCollector
from serving.config import BatcherConfig
from serving.gpu import MemoryGrowthWatch, NvmlProbe
from serving.metrics import ServingMetrics
from serving.testing import FakeBackend, rows
from tests.builders import node, pod
from tests.node.agent.fakes import POD_A, POD_B, FakeLister, RecordingWriter, fake_nvml
from tests.scheduler.extender.helpers import k8s_pod, post, serve

ROOT: Final = Path(__file__).resolve().parents[2]
H100_RECORDING: Final = ROOT / "tests" / "serving" / "data" / "nvml_2x_h100.json"

# Series the rules and dashboards read from outside gpufrag, by source.
EXTERNAL: Final[Mapping[str, str]] = {
    "up": "Prometheus (one per scrape target)",
    "push_time_seconds": "the Pushgateway (time of the last push per group)",
    "kube_pod_container_resource_requests": "kube-state-metrics",
    "kube_horizontalpodautoscaler_status_current_replicas": "kube-state-metrics",
    "kube_horizontalpodautoscaler_status_desired_replicas": "kube-state-metrics",
    "kube_horizontalpodautoscaler_spec_min_replicas": "kube-state-metrics",
}


def extender_metrics() -> str:
    runtime = serve([node("gpu-a", gpu_count=4)], [])
    client = runtime.app.test_client()
    body = {"Pod": k8s_pod(pod("p", gpu_milli=500)), "NodeNames": ["gpu-a"]}
    assert post(client, "/filter", body)[0] == 200
    assert post(client, "/prioritize", body)[0] == 200
    assert post(client, "/filter", b"{not json")[0] == 400

    class Outcomes:
        outcomes: Mapping[str, int] = {"written": 1}

    metrics: ExtenderMetrics = runtime.metrics
    metrics.registry.register(SkipEventCollector(Outcomes()))
    text: str = client.get("/metrics").data.decode()
    return text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def agent_metrics(proc_root: Path) -> str:
    """Start the agent (its loop and HTTP server), scrape it once it is ready, stop it."""
    for pid, uid in ((4242, POD_A.uid), (5151, POD_B.uid)):  # the recorded GPU processes
        (proc_root / str(pid)).mkdir(parents=True)
        (proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{uid.replace('-', '_')}.slice/cri-containerd-abc.scope\n")
    port = _free_port()
    stop = threading.Event()
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(agent_cli.main(
        ["--node-name", "node1", "--metrics-port", str(port), "--proc-root", str(proc_root)],
        nvml=fake_nvml(), writer=RecordingWriter(),
        pod_lister=FakeLister([PodRecord(POD_A), PodRecord(POD_B)]), stop=stop)))
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the agent never became ready"
                time.sleep(0.02)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text: str = reply.read().decode()
    finally:
        stop.set()
        runner.join(timeout=10)
    assert codes == [0]
    return text


def serving_metrics() -> str:
    metrics = ServingMetrics(model="resnet50")
    reader = NvmlReader(RecordedNvml(RecordedNvml.load(H100_RECORDING).devices))
    reader.open()
    probe = NvmlProbe(reader)
    metrics.add_gpu_collector(probe)
    metrics.record_settings(BatcherConfig())
    metrics.record_model_load(backend="onnxruntime", cache="warm", seconds=1.5)
    # The recording's second memory read of GPU 1 is 300 MiB up: one batch over 100 MiB.
    watch = MemoryGrowthWatch(FakeBackend(), probe, threshold_mib=100, observer=metrics)
    watch.infer(rows(2))
    watch.infer(rows(2))
    metrics.queue_depth(3)
    metrics.batch(2, [0.001, 0.002], 0.004)
    metrics.request_seconds.observe(0.01)
    metrics.outcome("ok", 2)
    return metrics.render().decode()


def defrag_metrics() -> str:
    metrics = CycleMetrics(dry_run=False)
    metrics.planned(2, 0.05)
    metrics.evicted()
    metrics.refused("pdb")
    metrics.failed("bind_timeout")
    metrics.landed(on_target=True)
    metrics.skipped("trigger_cleared")
    for phase in ("before", "after"):
        metrics.phase(phase, Summary(idle_ratio=0.3, idle_gib=12.0, burst_headroom_gib=4.0,
                                     frag_ratio=0.2,
                                     frag_gpus=0.5, free_whole_gpus=1, free_gpu_nodes=0,
                                     allocated_gpus=6.0, nodes_with_usage=2))
    metrics.finished(3.0)
    return generate_latest(metrics.registry).decode()


def deviceplugin_metrics() -> str:
    metrics = PluginMetrics("node1", recorded=True)
    metrics.observe_health(Gpu(index=0, uuid="GPU-aaaa", product="NVIDIA A100-SXM4-80GB",
                               memory_total_mib=81_920), True)
    metrics.registered.labels("nvidia.com/gpu").set(1)
    metrics.registrations.labels("nvidia.com/gpu", "ok").inc()
    metrics.allocations.labels("nvidia.com/gpu", "ok").inc()
    return metrics.render().decode()


def admission_metrics() -> str:
    metrics = AdmissionMetrics()
    metrics.reviews.labels("mutated").inc()
    metrics.milli_saved.inc(400)
    metrics.reviews.labels("skipped").inc()
    metrics.skips.labels(SKIP_REASONS[0]).inc()
    metrics.carriers.inc()
    metrics.seconds.observe(0.004)
    return generate_latest(metrics.registry).decode()


def metric_names(text: str) -> set[str]:
    """Every series name the exposition text has or would have once its labels are set: the
    samples' names, and for families without samples the names their type implies."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
        else:
            names.add(family.name)
    return names


__all__ = ["EXTERNAL", "admission_metrics", "agent_metrics", "defrag_metrics",
           "deviceplugin_metrics", "extender_metrics", "metric_names", "serving_metrics"]
