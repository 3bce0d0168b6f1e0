"""Test doubles for the device plugin: a pod source, a recording writer, an allocator."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from gpufrag.conventions import ANNOTATION_GPU_ALLOCATED, DEFAULT_NAMES
from node.deviceplugin.allocator import Allocator
from node.deviceplugin.config import DevicePluginConfig
from node.deviceplugin.matching import PodAsk
from node.deviceplugin.metrics import PluginMetrics
from node.deviceplugin.pods import NodePods
from node.deviceplugin.trust import FixedRecordKeys
from node.deviceplugin.writes import PodWriteError
from node.gpus import DeviceNodes
from node.health import HealthBoard
from tests.node.deviceplugin.builders import build_board, build_config
from tests.records import SIGNER


class FakePods:
    """:class:`~node.deviceplugin.allocator.PodSource` over a :class:`NodePods`; ``listed``
    is what the API server would answer to a relist (None: the cache is all there is).
    As the CLI wires it, a pod the cache finds gone is forgotten by the allocators in
    ``forget_in`` (a relist that drops a pod calls back into the allocator)."""

    def __init__(self, pods: Sequence[Mapping[str, Any]] = ()) -> None:
        self.forget_in: list[Allocator] = []
        self.cache = NodePods(DEFAULT_NAMES, annotation_allocated=ANNOTATION_GPU_ALLOCATED,
                              on_gone=self._forget)
        self.cache.replace(list(pods))
        self.listed: list[Mapping[str, Any]] | None = None
        self.relists = 0
        self.relist_error: Exception | None = None

    def _forget(self, uid: str) -> None:
        for allocator in self.forget_in:
            allocator.forget(uid)

    def asks(self) -> list[PodAsk]:
        return self.cache.asks()

    def relist(self) -> None:
        self.relists += 1
        if self.relist_error is not None:
            raise self.relist_error
        if self.listed is not None:
            self.cache.replace(self.listed)


@dataclass
class RecordingWriter:
    """Records writes; ``fail_marks`` makes every mark fail as an unreachable API server."""

    marks: list[tuple[str, str, dict[str, tuple[str, ...]]]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)
    fail_marks: bool = False

    def mark_allocated(self, pod: PodAsk, key: str, given: Mapping[str, tuple[str, ...]]) -> None:
        if self.fail_marks:
            raise PodWriteError("marking: cannot reach the API server", retryable=True)
        self.marks.append((pod.key, key, dict(given)))

    def warn(self, pod: PodAsk, message: str, *, now: float) -> None:
        self.warnings.append((pod.key, message))


@dataclass
class Setup:
    allocator: Allocator
    pods: FakePods
    writer: RecordingWriter
    board: HealthBoard
    metrics: PluginMetrics
    config: DevicePluginConfig


def build_allocator(pods: Sequence[Mapping[str, Any]] = (), *, unhealthy: Sequence[int] = (),
                    devices: Sequence[str] = ("nvidia0", "nvidia1", "nvidia2", "nvidia3",
                                              "nvidiactl", "nvidia-uvm"),
                    clock: Callable[[], float] = lambda: 1_767_225_600.0,
                    **config: Any) -> Setup:
    cfg = build_config(**config)
    board = build_board(unhealthy=unhealthy)
    source = FakePods(pods)
    writer = RecordingWriter()
    metrics = PluginMetrics(cfg.node_name, recorded=True)
    present = {f"/dev/{name}" for name in devices}
    nodes = DeviceNodes.find(board.gpus, cfg, exists=lambda path: path in present)
    allocator = Allocator(cfg, board, source, writer, metrics, log=structlog.get_logger("test"),
                          nodes=nodes, records=FixedRecordKeys(SIGNER.verifier()), clock=clock)
    source.forget_in.append(allocator)
    return Setup(allocator, source, writer, board, metrics, cfg)
