"""The agent's interval loop: read NVML -> attribute processes to pods -> export -> publish.

One :meth:`Agent.tick` is one interval, with every collaborator injected (reader, pid -> pod
lookup, publisher, metrics, clock), so the whole loop runs in tests against recorded NVML
readings and a recording writer. :meth:`Agent.run` only adds the pacing.

A failed interval (NVML error, API server unreachable) is logged and retried at the next one;
the loop never dies of it. Readiness turns true after the first interval whose reading was read
and published.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from gpufrag.errors import BadInput
from gpufrag.gpu_usage import (
    REFRESH_INTERVALS,
    GpuUsage,
    NodeGpuUsage,
    PodGpuUsage,
    StrayProcess,
)
from gpufrag.nvml import GpuReadError, GpuReading
from gpufrag.records import AllocationMismatch, allocation_mismatch
from node.agent import isolation, mig, peaks
from node.agent.cgroup import PodRef, PodShare
from node.agent.isolation import ShareWatch
from node.agent.leakwatch import DEFAULT_INTERVALS, DEFAULT_THRESHOLD_MIB, LeakWatch
from node.agent.metrics import AgentMetrics, Health
from node.agent.publish import (
    EVENT_REASON_GPU_ALLOCATION_MISMATCH,
    EVENT_REASON_GPU_MEMORY_GROWTH,
    EVENT_REASON_GPU_MEMORY_OVER_SHARE,
    EVENT_REASON_GPU_PROCESS_WITHOUT_POD,
    Publisher,
    PublishError,
)

DEFAULT_INTERVAL_S = 15.0
DEFAULT_TOLERANCE_MIB = 64
DEFAULT_TOLERANCE_PCT = 10


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's knobs, validated once at start-up (:meth:`validate`)."""

    node_name: str
    interval_s: float = DEFAULT_INTERVAL_S
    # Publish when a GPU's or pod's memory moves by more than this, or utilisation by more than
    # tolerance_pct points; smaller moves wait for the refresh.
    tolerance_mib: int = DEFAULT_TOLERANCE_MIB
    tolerance_pct: int = DEFAULT_TOLERANCE_PCT
    # Republish an unchanged reading after this many intervals, so readers can tell it is live.
    refresh_intervals: int = REFRESH_INTERVALS
    leak_threshold_mib: int = DEFAULT_THRESHOLD_MIB
    leak_intervals: int = DEFAULT_INTERVALS
    # The isolation check (node.agent.isolation): a share pod over its share by more than
    # share_tolerance_mib for share_intervals readings in a row is reported, at most once per
    # share_cooldown_s.
    share_tolerance_mib: int = isolation.DEFAULT_TOLERANCE_MIB
    share_intervals: int = isolation.DEFAULT_INTERVALS
    share_cooldown_s: float = isolation.DEFAULT_COOLDOWN_S
    # Each pod's peak is published over this window (node.agent.peaks).
    peak_window_s: float = peaks.DEFAULT_WINDOW_S
    # The shared names section (the usage annotation's key among them).
    names: KubeNames = DEFAULT_NAMES

    @property
    def refresh_s(self) -> float:
        return self.refresh_intervals * self.interval_s

    def validate(self) -> AgentConfig:
        """Return self, or raise :class:`BadInput` naming the flag to fix."""
        if not self.node_name:
            raise BadInput("unknown node name: pass --node-name or set NODE_NAME (the DaemonSet "
                           "sets it from spec.nodeName)", field="node_name")
        checks: list[tuple[str, bool, str]] = [
            ("interval_s", self.interval_s > 0, "> 0 seconds"),
            ("tolerance_mib", self.tolerance_mib >= 0, ">= 0 MiB"),
            ("tolerance_pct", 0 <= self.tolerance_pct <= 100, "in 0..100"),
            ("refresh_intervals", self.refresh_intervals >= 1, ">= 1"),
            ("leak_threshold_mib", self.leak_threshold_mib >= 0, ">= 0 MiB"),
            ("leak_intervals", self.leak_intervals >= 1, ">= 1"),
            ("share_tolerance_mib", self.share_tolerance_mib >= 0, ">= 0 MiB"),
            ("share_intervals", self.share_intervals >= 1, ">= 1"),
            ("share_cooldown_s", self.share_cooldown_s >= 0, ">= 0 seconds"),
            ("peak_window_s", math.isfinite(self.peak_window_s)
             and self.peak_window_s >= peaks.DEFAULT_BUCKET_S,
             f">= {peaks.DEFAULT_BUCKET_S:g} seconds (one bucket)"),
        ]
        for name, ok, bound in checks:
            if not ok:
                raise BadInput(f"{getattr(self, name)!r} must be {bound}", field=name)
        return self


class GpuReader(Protocol):
    def read(self) -> tuple[GpuReading, ...]: ...


class PidToPod(Protocol):
    def pod_for_pid(self, pid: int) -> PodRef | None: ...

    def stray_reason(self, pid: int) -> str: ...


def no_shares(uid: str) -> PodShare | None:
    """The share lookup of an agent that knows no pod's share (the isolation check is off)."""
    return None


def no_pods() -> list[tuple[PodRef, PodShare]]:
    """The pod list of an agent that knows no pod's share (the allocation check is off)."""
    return []


def allocation_mismatches(readings: Iterable[GpuReading],
                          pods: Iterable[tuple[PodRef, PodShare]]
                          ) -> list[tuple[PodRef, AllocationMismatch]]:
    """Each pod whose device-plugin mark (``given``) names GPUs its gpu-indices record does not,
    this reading's NVML index -> UUID telling which GPU is which. Pods without a record (placed
    by another scheduler: the kubelet chose) or without a mark are not compared."""
    uuid_by_index = {reading.index: reading.uuid for reading in readings}
    found = []
    for pod, share in sorted(pods, key=lambda p: (p[0].namespace, p[0].name, p[0].uid)):
        if share.gpus is None or not share.given:
            continue
        mismatch = allocation_mismatch(share.gpus, share.given, uuid_by_index)
        if mismatch is not None:
            found.append((pod, mismatch))
    return found


def build_usage(node: str, timestamp: float, interval_s: float,
                readings: Iterable[GpuReading],
                pod_for_pid: Callable[[int], PodRef | None],
                stray_reason: Callable[[int], str] | None = None) -> NodeGpuUsage:
    """Turn NVML readings into the annotation value: processes summed per pod, per GPU.

    Processes outside any known pod are left out of ``pods``; their memory still counts in the
    GPU's ``memory_used_mib``, and with ``stray_reason`` each is listed in the GPU's ``strays``
    with why it has no pod (unless the reason is '': a process that is in no pod by design).
    A GPU in MIG mode also lists its instances (``mig``), each with the pods running on it;
    its ``utilization_pct`` is 0 where NVML has no GPU-level figure, which the ``mig`` key
    marks as no reading (docs/agent.md).
    """
    pods_by_pid: dict[int, PodRef | None] = {}
    reasons: dict[int, str] = {}
    gpus = []
    for reading in sorted(readings, key=lambda r: r.index):
        memory_by_pod: dict[PodRef, int] = defaultdict(int)
        strays: list[StrayProcess] = []
        for process in reading.processes:
            if process.pid not in pods_by_pid:
                pods_by_pid[process.pid] = pod_for_pid(process.pid)
            pod = pods_by_pid[process.pid]
            if pod is not None:
                memory_by_pod[pod] += process.memory_used_mib
            elif stray_reason is not None:
                if process.pid not in reasons:
                    reasons[process.pid] = stray_reason(process.pid)
                if reasons[process.pid]:  # '': no stray (the MPS server)
                    strays.append(StrayProcess(process.pid, process.memory_used_mib,
                                               reasons[process.pid]))
        pods = tuple(
            PodGpuUsage(pod.namespace, pod.name, pod.uid, mib)
            for pod, mib in sorted(memory_by_pod.items(),
                                   key=lambda item: (item[0].namespace, item[0].name, item[0].uid))
        )
        gpus.append(GpuUsage(
            index=reading.index,
            uuid=reading.uuid,
            product=reading.product,
            memory_used_mib=reading.memory_used_mib,
            memory_total_mib=reading.memory_total_mib,
            utilization_pct=reading.utilization_pct,
            pods=pods,
            strays=tuple(sorted(strays, key=lambda stray: stray.pid)),
            mig=mig.instance_usages(reading, pods_by_pid),
        ))
    return NodeGpuUsage(node=node, timestamp=round(timestamp, 3), interval_s=interval_s,
                        gpus=tuple(gpus))


def memory_by_pod(usage: NodeGpuUsage) -> dict[PodRef, int]:
    """Each pod's GPU memory summed over the node's GPUs (what the leak watch follows)."""
    totals: dict[PodRef, int] = defaultdict(int)
    for gpu in usage.gpus:
        for pod in gpu.pods:
            totals[PodRef(pod.namespace, pod.name, pod.uid)] += pod.memory_used_mib
    return dict(totals)


class Agent:
    def __init__(self, config: AgentConfig, *, reader: GpuReader, pods: PidToPod,
                 publisher: Publisher, metrics: AgentMetrics, health: Health,
                 log: FilteringBoundLogger, clock: Callable[[], float] = time.time,
                 shares: Callable[[str], PodShare | None] = no_shares,
                 pod_shares: Callable[[], Iterable[tuple[PodRef, PodShare]]] = no_pods) -> None:
        self.config = config
        self._reader = reader
        self._pods = pods
        self._publisher = publisher
        self._metrics = metrics
        self._health = health
        self._log = log
        self._clock = clock
        self._leaks = LeakWatch(interval_s=config.interval_s,
                                threshold_mib=config.leak_threshold_mib,
                                intervals=config.leak_intervals)
        self._peaks = peaks.PeakWindow(config.peak_window_s)
        self._shares = shares
        self._share_watch = ShareWatch(tolerance_mib=config.share_tolerance_mib,
                                       intervals=config.share_intervals,
                                       cooldown_s=config.share_cooldown_s)
        # (pid, GPU UUID) of the strays reported: one Event each while they stay
        self._strays_reported: set[tuple[int, str]] = set()
        self._pod_shares = pod_shares
        # (pod UID, reason) of the allocation mismatches reported: one Event each while it stays
        self._mismatches_reported: set[tuple[str, str]] = set()
        self._unplaced_told = False  # the MIG placements NVML refused: said once

    def tick(self) -> NodeGpuUsage | None:
        """One interval. Returns the reading, or None when reading or publishing failed."""
        now = self._clock()
        self._health.mark_tick(now)
        try:
            readings = self._reader.read()
        except GpuReadError as exc:
            self._metrics.reads.labels("error").inc()
            self._log.error("gpu_read_failed", error=str(exc))
            return None
        self._metrics.reads.labels("ok").inc()
        # build_usage looks each process's pod up once; its strays come from the same lookups.
        usage = self._peaks.observe(build_usage(self.config.node_name, now,
                                                self.config.interval_s, readings,
                                                self._pods.pod_for_pid, self._pods.stray_reason))
        self._metrics.observe_usage(usage, no_utilization=frozenset(
            r.index for r in readings if not r.utilization_supported))
        self._warn_unplaced(readings)
        self._watch_leaks(usage, now)
        self._check_shares(usage, now)
        self._report_strays(usage, now)
        self._check_allocations(readings, now)
        try:
            reason = self._publisher.publish(usage)
        except PublishError as exc:
            self._metrics.publishes.labels("error").inc()
            self._log.error("publish_failed", error=str(exc), retryable=exc.retryable)
            return None
        if reason is not None:
            self._metrics.publishes.labels(reason).inc()
            self._metrics.last_publish_s.set(usage.timestamp)
            self._log.debug("published", reason=reason, gpus=len(usage.gpus))
        if not self._health.ready:
            self._health.mark_ready()
            self._log.info("ready", gpus=len(usage.gpus),
                           pods=sum(len(gpu.pods) for gpu in usage.gpus))
        return usage

    def _warn_unplaced(self, readings: Iterable[GpuReading]) -> None:
        """One warning per process when NVML would not place a GPU's MIG instances (the
        annotation then lists that GPU without ``mig``: node.agent.mig)."""
        unplaced = [r.index for r in readings if r.mig_mode and not mig.placed(r)]
        if unplaced and not self._unplaced_told:
            self._unplaced_told = True
            self._log.warning("mig_placements_unreadable", gpus=unplaced,
                              why="nvmlDeviceGetGpuInstanceById requires a privileged user",
                              effect="these GPUs are published without their MIG instances")

    def _watch_leaks(self, usage: NodeGpuUsage, now: float) -> None:
        per_pod = memory_by_pod(usage)
        for suspect in self._leaks.observe(per_pod, now):
            pod = suspect.pod
            self._log.warning("gpu_memory_growth", namespace=pod.namespace, pod=pod.name,
                              start_mib=suspect.start_mib, current_mib=suspect.current_mib,
                              intervals=suspect.intervals)
            self._warn_pod(pod, EVENT_REASON_GPU_MEMORY_GROWTH, suspect.message(), now)
        self._metrics.observe_leaks(per_pod, self._leaks.suspected)

    def _check_shares(self, usage: NodeGpuUsage, now: float) -> None:
        checked, due = self._share_watch.observe(usage, self._shares, now)
        for overrun in due:
            pod = overrun.pod
            self._log.warning("gpu_memory_over_share", namespace=pod.namespace, pod=pod.name,
                              gpu=overrun.gpu_index, used_mib=overrun.used_mib,
                              share_mib=overrun.share_mib, chosen=overrun.chosen)
            self._warn_pod(pod, EVENT_REASON_GPU_MEMORY_OVER_SHARE, overrun.message(), now)
        self._metrics.observe_shares(checked, self.config.share_intervals)

    def _report_strays(self, usage: NodeGpuUsage, now: float) -> None:
        """One Node Event per stray process (a GPU's ``strays``, :func:`build_usage`) while it
        stays; the metric every interval."""
        strays = [(gpu, stray) for gpu in usage.gpus for stray in gpu.strays]
        self._metrics.observe_strays((s.reason, s.memory_used_mib) for _, s in strays)
        self._strays_reported &= {(s.pid, gpu.uuid) for gpu, s in strays}  # left: new again
        for gpu, stray in strays:
            key = (stray.pid, gpu.uuid)
            if key in self._strays_reported:
                continue
            self._log.warning("gpu_process_without_pod", pid=stray.pid, gpu=gpu.index,
                              uuid=gpu.uuid, memory_mib=stray.memory_used_mib,
                              reason=stray.reason)
            try:
                self._publisher.report_stray(stray.message(gpu.index, gpu.uuid), now,
                                             about=f"{stray.pid}/{gpu.uuid}")
            except PublishError as exc:
                self._log.warning("event_failed", error=str(exc), pid=stray.pid)
                continue  # asked again next interval
            self._strays_reported.add(key)
            self._metrics.events.labels(EVENT_REASON_GPU_PROCESS_WITHOUT_POD).inc()

    def _check_allocations(self, readings: Iterable[GpuReading], now: float) -> None:
        found = allocation_mismatches(readings, self._pod_shares())
        self._metrics.observe_allocation_mismatches(m.reason for _, m in found)
        self._mismatches_reported &= {(pod.uid, m.reason) for pod, m in found}
        for pod, mismatch in found:
            key = (pod.uid, mismatch.reason)
            if key in self._mismatches_reported:
                continue
            self._log.warning("gpu_allocation_mismatch", namespace=pod.namespace, pod=pod.name,
                              reason=mismatch.reason, recorded=list(mismatch.recorded),
                              given=list(mismatch.given))
            if self._warn_pod(pod, EVENT_REASON_GPU_ALLOCATION_MISMATCH, mismatch.message(),
                              now):
                self._mismatches_reported.add(key)  # else asked again next interval

    def _warn_pod(self, pod: PodRef, reason: str, message: str, now: float) -> bool:
        """One Warning Event on ``pod``, counted by ``reason``; False when it could not be
        written: the metric still shows the finding, and one lost Event is not worth failing
        the interval."""
        try:
            self._publisher.report_pod(pod, reason, message, now)
        except PublishError as exc:
            self._log.warning("event_failed", error=str(exc), namespace=pod.namespace,
                              pod=pod.name)
            return False
        self._metrics.events.labels(reason).inc()
        return True

    def run(self, wait: Callable[[float], bool]) -> None:
        """Tick every ``interval_s`` until ``wait(delay)`` returns True (stop requested).

        ``wait`` is ``threading.Event.wait`` in the CLI and a fake clock's step in tests.
        Intervals are paced from the start of each tick; a tick that overran starts the next
        one at once rather than queueing up missed ones.
        """
        interval_s = self.config.interval_s
        while True:
            started = self._clock()
            self.tick()
            delay = max(0.0, started + interval_s - self._clock())
            if wait(delay):
                return
