"""Test doubles for the node agent: recorded NVML, a clock, a log, a writer, an API server.

NVML is the shared recorded fake (:class:`gpufrag.nvml_recorded.RecordedNvml`) on readings
recorded from a 2 x A100-SXM4-80GB node (bytes as NVML reports them); :func:`build_gpu` builds
variants with keyword overrides, in the spirit of descheduler's ``BuildTestNode``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from structlog.typing import FilteringBoundLogger

from gpufrag.nvml import MIB
from gpufrag.nvml_recorded import RecordedDevice, RecordedNvml, RecordedProcess, RecordedSample
from node.agent.cgroup import PodRecord, PodRef

A100_TOTAL_BYTES = 85_899_345_920  # 81920 MiB, as nvmlDeviceGetMemoryInfo reports it


# --- NVML ----------------------------------------------------------------------------------------


def build_gpu(uuid: str | bytes, *, name: str | bytes = "NVIDIA A100-SXM4-80GB",
              used_bytes: int = 0, total_bytes: int = A100_TOTAL_BYTES, utilization_pct: int = 0,
              compute: Sequence[tuple[int, int | None]] = (),
              graphics: Sequence[tuple[int, int | None]] = (),
              errors: dict[str, list[str | None]] | None = None) -> RecordedDevice:
    """One GPU's recorded answers (one sample); ``compute``/``graphics`` are (pid, bytes) and
    ``errors`` maps an NVML function name to the pynvml error names its calls raise."""
    return RecordedDevice(
        name=name, uuid=uuid, memory_total_bytes=total_bytes,
        samples=[RecordedSample(utilization_pct=utilization_pct, memory_used_bytes=used_bytes)],
        processes=processes(*compute), graphics_processes=processes(*graphics),
        errors=dict(errors or {}),
    )


def processes(*pid_bytes: tuple[int, int | None]) -> list[RecordedProcess]:
    """(pid, used bytes) pairs as recorded processes."""
    return [RecordedProcess(pid, used) for pid, used in pid_bytes]


def recorded_devices() -> list[RecordedDevice]:
    """Two GPUs: GPU 0 shared by two inference pods, GPU 1 by one pod plus a host process."""
    return [
        build_gpu(
            "GPU-5a3c9f1e-7b2d-4c8e-9f01-23456789abcd",
            used_bytes=30_512 * MIB + 123_456,
            utilization_pct=63,
            compute=[(4242, 20_000 * MIB), (5151, 10_000 * MIB)],
        ),
        build_gpu(
            "GPU-0d1e2f3a-4b5c-6d7e-8f90-a1b2c3d4e5f6",
            used_bytes=12_800 * MIB,
            utilization_pct=17,
            compute=[(6060, 12_000 * MIB)],
            graphics=[(7070, 256 * MIB)],
        ),
    ]


def fake_nvml(devices: Sequence[RecordedDevice] | None = None, *,
              init_error: str | None = None) -> RecordedNvml:
    """The shared recorded NVML on :func:`recorded_devices` (or ``devices``); ``init_error``
    names the pynvml error ``nvmlInit`` raises."""
    return RecordedNvml(recorded_devices() if devices is None else devices,
                        init_error=init_error)


# --- pods ----------------------------------------------------------------------------------------

POD_A = PodRef("serving", "llama-7b-0", "0b8f0c8e-1111-4a4a-9b9b-000000000001")
POD_B = PodRef("serving", "mistral-7b-0", "0b8f0c8e-2222-4a4a-9b9b-000000000002")
POD_C = PodRef("batch", "embed-0", "0b8f0c8e-3333-4a4a-9b9b-000000000003")
# pid -> pod on the recorded node; pid 7070 is a host process (Xorg), in no pod.
RECORDED_PIDS: dict[int, PodRef] = {4242: POD_A, 5151: POD_B, 6060: POD_C}


def pod_events(writer: RecordingWriter) -> list[dict[str, Any]]:
    """The Events written on pods (not the Node's: recorded_devices has a host process)."""
    return [e for e in writer.events if e["pod"] is not None]


class FakePods:
    """pid -> pod from a dict, counting lookups."""

    def __init__(self, by_pid: dict[int, PodRef] | None = None) -> None:
        self.by_pid = dict(RECORDED_PIDS if by_pid is None else by_pid)
        self.lookups: list[int] = []
        self.gone: set[int] = set()  # pids whose cgroup names a pod the node no longer lists

    def pod_for_pid(self, pid: int) -> PodRef | None:
        self.lookups.append(pid)
        return self.by_pid.get(pid)

    def stray_reason(self, pid: int) -> str:
        return "pod_gone" if pid in self.gone else "no_pod"


class FakeLister:
    def __init__(self, records: Sequence[PodRecord] = (), error: Exception | None = None) -> None:
        self.records = list(records)
        self.error = error
        self.calls = 0

    def list_pods(self) -> list[PodRecord]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return list(self.records)


# --- clock, log, writer --------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 1_732_900_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingLog:
    """Collects (level, event, fields); stands in for a structlog bound logger."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self._bound: dict[str, Any] = {}

    def _add(self, level: str, event: str, **kw: Any) -> None:
        self.records.append((level, event, {**self._bound, **kw}))

    def debug(self, event: str, **kw: Any) -> None:
        self._add("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._add("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._add("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._add("error", event, **kw)

    def bind(self, **kw: Any) -> RecordingLog:
        self._bound.update(kw)
        return self

    def events(self, level: str | None = None) -> list[str]:
        return [e for lvl, e, _ in self.records if level is None or lvl == level]

    def as_logger(self) -> FilteringBoundLogger:
        return cast(FilteringBoundLogger, self)


@dataclass
class RecordingWriter:
    """A ClusterWriter that remembers every write; ``fail_with`` makes the next writes raise."""

    patches: list[tuple[str, str, str]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    fail_with: Exception | None = None

    def patch_node_annotation(self, node: str, key: str, value: str) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.patches.append((node, key, value))

    def create_pod_event(self, pod: PodRef, *, reason: str, message: str, event_type: str,
                         now: float) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.events.append({"pod": pod, "reason": reason, "message": message,
                            "type": event_type, "now": now})

    def create_node_event(self, *, reason: str, message: str, event_type: str,
                          now: float, about: str = "") -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.events.append({"pod": None, "reason": reason, "message": message,
                            "type": event_type, "now": now, "about": about})
