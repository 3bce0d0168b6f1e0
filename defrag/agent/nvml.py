"""Read GPUs and the processes on them through NVML (pynvml).

Only a handful of NVML calls are used; :class:`NvmlApi` names them, so tests hand the reader a
recorded fake and the real ``pynvml`` module satisfies the same shape. Everything here speaks
NVML's units (bytes) on the way in and MiB on the way out.

A node without a GPU, or without the NVIDIA driver / ``libnvidia-ml.so.1``, is not a fault of
the agent: :meth:`NvmlReader.open` raises :class:`NoGpuError` with a message that says which
of those it is, and the CLI turns that into one log line and exit code 3.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

import pynvml

_MIB = 1024 * 1024


class NoGpuError(RuntimeError):
    """No GPU to read: NVML library missing, driver not loaded, or zero devices."""


class GpuReadError(RuntimeError):
    """NVML is there but a call failed (GPU lost, driver mismatch, permissions)."""


class MemoryInfo(Protocol):
    @property
    def used(self) -> int: ...
    @property
    def total(self) -> int: ...


class Utilization(Protocol):
    @property
    def gpu(self) -> int: ...


class ProcessInfo(Protocol):
    @property
    def pid(self) -> int: ...
    # None when the driver cannot tell (NVML_VALUE_NOT_AVAILABLE, e.g. under WDDM).
    @property
    def usedGpuMemory(self) -> int | None: ...  # NVML's camelCase name


class NvmlApi(Protocol):
    """The pynvml calls the agent makes; the ``pynvml`` module itself conforms."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> MemoryInfo: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]: ...
    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> Sequence[ProcessInfo]: ...


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process with a context on a GPU; ``pid`` is in the host's PID namespace."""

    pid: int
    memory_used_mib: int


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    uuid: str
    product: str
    memory_used_mib: int
    memory_total_mib: int
    utilization_pct: int
    processes: tuple[ProcessReading, ...] = ()


def load_pynvml() -> NvmlApi:
    """The real NVML binding. Importing it never needs the library; ``nvmlInit`` does."""
    api: NvmlApi = pynvml
    return api


# NVML errors that mean "there is no GPU here to read" rather than "reading failed".
_NO_GPU_ERRORS: dict[type[Exception], str] = {
    pynvml.NVMLError_LibraryNotFound: (
        "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this node, or the "
        "container was started without the NVIDIA runtime"
    ),
    pynvml.NVMLError_DriverNotLoaded: "NVIDIA driver not loaded on this node",
}


class NvmlReader:
    """Opens NVML once and reads every GPU on each :meth:`read`.

    Use as a context manager, or call :meth:`open` and :meth:`close`.
    """

    def __init__(self, api: NvmlApi | None = None) -> None:
        self._api = api if api is not None else load_pynvml()
        self._handles: list[object] = []
        self._open = False

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def open(self) -> int:
        """Initialise NVML and find the GPUs; returns how many. Raises :class:`NoGpuError`."""
        try:
            self._api.nvmlInit()
        except pynvml.NVMLError as exc:
            for error_type, message in _NO_GPU_ERRORS.items():
                if isinstance(exc, error_type):
                    raise NoGpuError(message) from None
            raise GpuReadError(f"NVML initialisation failed: {exc}") from None
        self._open = True
        try:
            count = self._api.nvmlDeviceGetCount()
            if count == 0:
                raise NoGpuError("NVML found zero GPUs on this node")
            self._handles = [self._api.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.close()
            raise GpuReadError(f"NVML could not list GPUs: {exc}") from None
        except NoGpuError:
            self.close()
            raise
        return count

    def close(self) -> None:
        if self._open:
            self._open = False
            self._handles = []
            # Shutting down anyway; an error here has nothing useful to say.
            with contextlib.suppress(pynvml.NVMLError):
                self._api.nvmlShutdown()

    def __enter__(self) -> NvmlReader:
        self.open()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def read(self) -> tuple[GpuReading, ...]:
        """Read every GPU; raises :class:`GpuReadError` naming the GPU and the failed call."""
        if not self._open:
            raise GpuReadError("NVML is not open; call open() first")
        return tuple(self._read_gpu(index, handle) for index, handle in enumerate(self._handles))

    def _read_gpu(self, index: int, handle: object) -> GpuReading:
        api = self._api
        try:
            uuid = _text(api.nvmlDeviceGetUUID(handle))
            product = _text(api.nvmlDeviceGetName(handle))
            memory = api.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading identity/memory failed: {exc}") from None
        try:
            utilization_pct = int(api.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError_NotSupported:
            utilization_pct = 0  # e.g. MIG-enabled GPUs; documented as 0 in docs/agent.md
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading utilisation failed: {exc}") from None
        return GpuReading(
            index=index,
            uuid=uuid,
            product=product,
            memory_used_mib=int(memory.used) // _MIB,
            memory_total_mib=int(memory.total) // _MIB,
            utilization_pct=min(max(utilization_pct, 0), 100),
            processes=self._read_processes(index, handle),
        )

    def _read_processes(self, index: int, handle: object) -> tuple[ProcessReading, ...]:
        # A process with both a compute and a graphics context shows up in both lists with the
        # same total; count it once.
        used_by_pid: dict[int, int] = {}
        for call in (self._api.nvmlDeviceGetComputeRunningProcesses,
                     self._api.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                processes = call(handle)
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError as exc:
                raise GpuReadError(f"GPU {index}: listing processes failed: {exc}") from None
            for process in processes:
                used = process.usedGpuMemory
                used_mib = 0 if used is None else int(used) // _MIB
                pid = int(process.pid)
                used_by_pid[pid] = max(used_by_pid.get(pid, 0), used_mib)
        return tuple(ProcessReading(pid, mib) for pid, mib in sorted(used_by_pid.items()))


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value
