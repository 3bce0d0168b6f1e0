"""The health of this node's GPUs, read through the shared NVML adapter: the one health
source of both delivery paths (the device plugin reports it to the kubelet as device health,
the DRA driver as a device taint in its ResourceSlices).

The inventory (index, UUID, product, total memory; :func:`node.gpus.read_inventory`) is read
once at start: it does not change while the driver is loaded. Health is re-read every
``health_interval_s``: one cheap NVML call per GPU (``nvmlDeviceGetMemoryInfo``); a GPU whose
read fails (``GpuIsLost`` after an XID 79, a driver error) is unhealthy until a read succeeds
again. This catches a GPU that fell off the bus or stopped answering; it does not watch NVML's
XID event stream as NVIDIA's own plugin does (the shared adapter does not expose it), so an ECC
error that leaves the GPU readable is not seen here.

:class:`HealthBoard` is the one shared state between the health thread and the gRPC threads: a
version number that moves on every change, and a condition variable that the device plugin's
ListAndWatch streams and the DRA driver's NodeWatchResources streams wait on. It holds one
entry per GPU and nothing else, so its memory is flat however long the plugin runs and however
often health flips.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from gpufrag.errors import BadInput
from gpufrag.nvml import GpuReadError, NoGpuError, NvmlApi, NvmlReader
from gpufrag.nvml_recorded import RecordedNvml
from node.gpus import Gpu

DEFAULT_HEALTH_INTERVAL_S = 5.0


class HealthBoard:
    """Per-GPU health (True = healthy) with a version and a condition to wait on."""

    def __init__(self, gpus: tuple[Gpu, ...]) -> None:
        self.gpus = gpus
        self.by_uuid = {gpu.uuid: gpu for gpu in gpus}
        self._healthy = {gpu.uuid: True for gpu in gpus}
        self._reasons: dict[str, str] = {}
        self._version = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def version(self) -> int:
        with self._changed:
            return self._version

    def snapshot(self) -> tuple[int, Mapping[str, bool]]:
        with self._changed:
            return self._version, dict(self._healthy)

    def is_healthy(self, uuid: str) -> bool:
        with self._changed:
            return self._healthy.get(uuid, False)

    def reason(self, uuid: str) -> str:
        with self._changed:
            return self._reasons.get(uuid, "")

    def set(self, uuid: str, healthy: bool, reason: str = "") -> bool:
        """Record ``uuid``'s health; True (and waiters woken) when it changed."""
        with self._changed:
            if self._healthy.get(uuid) == healthy:
                return False
            self._healthy[uuid] = healthy
            if healthy:
                self._reasons.pop(uuid, None)
            else:
                self._reasons[uuid] = reason
            self._version += 1
            self._changed.notify_all()
            return True

    def wait_change(self, seen: int, timeout_s: float) -> int:
        """Block until the version moves past ``seen``, the board closes, or the timeout; the
        version now."""
        with self._changed:
            if self._version == seen and not self._closed:
                self._changed.wait(timeout_s)
            return self._version

    def wake(self) -> None:
        """Wake every waiter now, changing nothing: a stream whose client went away looks at
        its context at once instead of at its timeout."""
        with self._changed:
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        with self._changed:
            return self._closed

    def close(self) -> None:
        """Wake every waiter for good (the plugin is stopping)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class HealthMonitor:
    """Reads every GPU each interval and records the result on a :class:`HealthBoard`.

    ``reader`` is asked for the reader at each pass, so the recorded mode can follow edits of
    its recording (:class:`FollowedRecording`)."""

    def __init__(self, reader: Callable[[], NvmlReader], board: HealthBoard, *,
                 log: FilteringBoundLogger,
                 on_change: Callable[[Gpu, bool, str], None] | None = None,
                 effect: str = "reported Unhealthy to the kubelet; no new container is "
                               "given it") -> None:
        self._reader = reader
        self._board = board
        self._log = log
        self._on_change = on_change
        self._effect = effect

    def check(self) -> None:
        """One pass over every GPU."""
        reader = self._reader()
        for gpu in self._board.gpus:
            try:
                reader.read_memory(gpu.index)
            except (GpuReadError, IndexError) as exc:  # IndexError: a recording lost it
                healthy, reason = False, str(exc)
            else:
                healthy, reason = True, ""
            if self._board.set(gpu.uuid, healthy, reason):
                if healthy:
                    self._log.info("gpu_healthy", gpu=gpu.index, uuid=gpu.uuid)
                else:
                    self._log.warning("gpu_unhealthy", gpu=gpu.index, uuid=gpu.uuid,
                                      reason=reason, effect=self._effect)
                if self._on_change is not None:
                    self._on_change(gpu, healthy, reason)

    def run(self, wait: Callable[[float], bool], interval_s: float) -> None:
        """Check, then ``wait(interval_s)`` until it returns True (stop)."""
        while True:
            try:
                self.check()
            except Exception:  # a bug in one pass must not end health reporting
                self._log.exception("health_check_failed")
            if wait(interval_s):
                return


class FollowedRecording:
    """The recorded inventory mode's reader, re-read when the recording file changes.

    Editing the recording is how a person (the demo) or a test makes a recorded GPU fail or
    recover: script ``"errors": {"nvmlDeviceGetMemoryInfo": "NVMLError_GpuIsLost"}`` on a
    device and the next health pass reports it Unhealthy. The inventory (which GPUs, their
    UUIDs) is the one read at start; a recording that changes it is reported, not followed.
    A recording that no longer loads keeps the last good one (and says so once per change).
    """

    def __init__(self, path: Path, reader: NvmlReader, *, log: FilteringBoundLogger,
                 load: Callable[[Path], NvmlApi]) -> None:
        self._path = path
        self._reader = reader
        self._log = log
        self._load = load
        self._stamp = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def __call__(self) -> NvmlReader:
        stamp = self._stat()
        if stamp == self._stamp or stamp is None:
            return self._reader
        self._stamp = stamp
        try:
            reader = NvmlReader(self._load(self._path))
            reader.open()
        except (BadInput, NoGpuError, GpuReadError) as exc:
            self._log.warning("recording_reload_failed", file=str(self._path), error=str(exc),
                              effect="health keeps following the last good recording")
            return self._reader
        old, self._reader = self._reader, reader
        old.close()
        self._log.info("recording_reloaded", file=str(self._path))
        return reader

    def close(self) -> None:
        self._reader.close()


@contextmanager
def health_reader(reader: NvmlReader, recording: Path | None, *,
                  log: FilteringBoundLogger) -> Iterator[Callable[[], NvmlReader]]:
    """What a :class:`HealthMonitor` reads through, for both node daemons: ``reader`` itself
    on live NVML, the :class:`FollowedRecording` of ``recording`` (closed when the block
    ends) in recorded mode, so editing the recording drives either daemon's health."""
    if recording is None:
        yield lambda: reader
        return
    follow = FollowedRecording(recording, reader, log=log, load=RecordedNvml.load)
    try:
        yield follow
    finally:
        follow.close()  # the reader it holds now (the first one is closed by its opener)
