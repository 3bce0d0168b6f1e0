"""GPU inventory and health from (recorded) NVML; the recording followed when edited."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import structlog

from gpufrag.nvml import NvmlReader
from gpufrag.nvml_recorded import RecordedDevice, RecordedNvml, RecordedSample
from node.gpus import read_inventory
from node.health import (
    FollowedRecording,
    HealthBoard,
    HealthMonitor,
)
from tests.node.deviceplugin.builders import UUIDS

TOTAL = 85_899_345_920


def _device(uuid: str, errors: dict[str, list[str | None]] | None = None) -> RecordedDevice:
    return RecordedDevice(name="NVIDIA A100-SXM4-80GB", uuid=uuid, memory_total_bytes=TOTAL,
                          samples=[RecordedSample(0, 0)], errors=dict(errors or {}))


def test_inventory_has_uuids_and_total_memory() -> None:
    with NvmlReader(RecordedNvml([_device(UUIDS[0]), _device(UUIDS[1])])) as reader:
        gpus = read_inventory(reader)
    assert [(g.index, g.uuid, g.memory_total_mib) for g in gpus] == [
        (0, UUIDS[0], 81_920), (1, UUIDS[1], 81_920)]


def test_a_failing_read_is_unhealthy_until_a_read_succeeds() -> None:
    script: list[str | None] = [None, "NVMLError_GpuIsLost", "NVMLError_GpuIsLost", None]
    nvml = RecordedNvml([_device(UUIDS[0]), _device(UUIDS[1], {
        "nvmlDeviceGetMemoryInfo": script})])
    with NvmlReader(nvml) as reader:
        board = HealthBoard(read_inventory(reader))  # the inventory takes the first answer
        changes: list[tuple[int, bool]] = []
        monitor = HealthMonitor(lambda: reader, board, log=structlog.get_logger("test"),
                                on_change=lambda gpu, ok, _: changes.append((gpu.index, ok)))
        seen = []
        for _ in range(3):
            monitor.check()
            seen.append(board.snapshot()[1][UUIDS[1]])
    assert seen == [False, False, True]
    assert changes == [(1, False), (1, True)]
    assert board.version == 2 and board.is_healthy(UUIDS[0])


def test_waiters_wake_on_a_change_and_on_close() -> None:
    board = HealthBoard(())
    board.set("GPU-x", True)  # an unknown GPU: recorded, the version moves
    version = board.version
    woke: list[int] = []
    thread = threading.Thread(target=lambda: woke.append(board.wait_change(version, 10)))
    thread.start()
    board.set("GPU-x", False, "lost")
    thread.join(5)
    assert woke == [version + 1]
    board.close()
    assert board.wait_change(board.version, 10) == board.version  # returns at once


def test_an_edited_recording_is_followed_and_a_broken_one_is_not(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"

    def write(lost: bool) -> None:
        device = {"name": "A100", "uuid": UUIDS[0], "memory_total": TOTAL,
                  "samples": [{"gpu": 0, "memory_used": 0}]}
        if lost:
            device["errors"] = {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}
        path.write_text(json.dumps({"devices": [device]}))

    write(False)
    first = NvmlReader(RecordedNvml.load(path))
    first.open()
    follow = FollowedRecording(path, first, log=structlog.get_logger("test"),
                               load=RecordedNvml.load)
    board = HealthBoard(read_inventory(first))
    monitor = HealthMonitor(follow, board, log=structlog.get_logger("test"))
    monitor.check()
    assert board.is_healthy(UUIDS[0])
    write(True)
    monitor.check()
    assert not board.is_healthy(UUIDS[0])
    path.write_text("{not json")
    monitor.check()  # keeps the last good recording
    assert not board.is_healthy(UUIDS[0])
    write(False)
    monitor.check()
    assert board.is_healthy(UUIDS[0])
    follow.close()
