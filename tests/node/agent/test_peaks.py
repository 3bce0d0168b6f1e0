"""Each pod's peak over a window, per GPU, as the agent publishes it (``peak_mib``)."""

from __future__ import annotations

import pytest

from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage, parse
from node.agent.peaks import PeakWindow

HOUR = 3600.0


def reading(t: float, **pods: int) -> NodeGpuUsage:
    return NodeGpuUsage("n1", t, 15.0, (GpuUsage(
        0, "GPU-a", "T4", sum(pods.values()), 16_384, 10,
        tuple(PodGpuUsage("ns", name, f"uid-{name}", mib) for name, mib in pods.items())),))


def peaks(usage: NodeGpuUsage) -> dict[str, tuple[int | None, float | None]]:
    return {p.name: (p.peak_mib, p.peak_since) for p in usage.gpus[0].pods}


def test_the_peak_is_the_most_used_over_the_window_since_the_pod_was_seen() -> None:
    window = PeakWindow(window_s=4 * HOUR, bucket_s=HOUR)
    start = 100 * HOUR
    assert peaks(window.observe(reading(start, a=1000))) == {"a": (1000, start)}
    assert peaks(window.observe(reading(start + 60, a=3000))) == {"a": (3000, start)}
    assert peaks(window.observe(reading(start + 2 * HOUR, a=500))) == {"a": (3000, start)}
    # Four hours on, the bucket of the 3,000 MiB peak has left the window.
    later = start + 5 * HOUR
    assert peaks(window.observe(reading(later, a=400))) == {"a": (500, later - 4 * HOUR)}


def test_pods_gone_from_a_reading_are_forgotten() -> None:
    window = PeakWindow(window_s=4 * HOUR, bucket_s=HOUR)
    window.observe(reading(0.0, a=5000, b=100))
    window.observe(reading(60.0, b=100))
    assert peaks(window.observe(reading(120.0, a=10, b=100))) == {"a": (10, 120.0),
                                                                "b": (100, 0.0)}


def test_the_annotation_carries_the_peak_and_reads_old_agents_without_it() -> None:
    usage = PeakWindow().observe(reading(1000.0, a=2048))
    again = parse(usage.to_json())
    assert again == usage and again.gpus[0].pods[0].window_peak_mib == 2048
    old = parse(reading(1000.0, a=2048).to_json())  # an agent before peaks
    assert old.gpus[0].pods[0].peak_mib is None
    assert old.gpus[0].pods[0].window_peak_mib == 2048


def test_a_peak_without_its_start_is_bad_input() -> None:
    text = reading(1000.0, a=2048).to_json().replace(
        '"memory_used_mib":2048}', '"memory_used_mib":2048,"peak_mib":4096}')
    with pytest.raises(Exception, match="peak_since"):
        parse(text)


@pytest.mark.parametrize(("window_s", "bucket_s"), [(0, 1), (10, 20), (float("nan"), 1)])
def test_a_window_that_is_not_a_positive_span_is_refused(window_s: float,
                                                        bucket_s: float) -> None:
    with pytest.raises(ValueError):
        PeakWindow(window_s, bucket_s)
