"""Read GPUs and the processes on them through NVML (pynvml): the one adapter every component uses.

The node agent (``node.agent``) and the serving runtime (``serving``) both read GPUs through
:class:`NvmlReader`, so there is one place that knows NVML's calls, its units and its errors.
Only a handful of NVML calls are used; :class:`NvmlApi` names them, so the real ``pynvml``
module and the recorded stand-in (:class:`gpufrag.nvml_recorded.RecordedNvml`) satisfy the same
shape and mypy checks both.

A GPU in MIG mode is read through NVML's MIG calls as well: each MIG device (a GPU instance
with its compute instance) with its placement (start slice and size, from the GPU instance's
info), its slice counts and memory, and the processes on it. The GPU's own process list is then
the union of its instances' lists, each process read once on the instance it runs on, since the
parent's list in MIG mode is an aggregate only privileged callers get. NVML has no GPU-level
utilisation for a GPU in MIG mode (``nvmlDeviceGetUtilizationRates`` raises ``NotSupported`` on a
MIG-enabled A100 or H100): the reading says so (:attr:`GpuReading.utilization_supported`) rather
than pass 0 off as idle. Where the placement lookup is refused (``nvmlDeviceGetGpuInstanceById``
requires a privileged user), the instance is read without its start and size. Naming a MIG
profile (``3g.40gb``) needs the MIG table above this layer, so this adapter reports NVML's numbers
and the agent names them.

Readings carry NVML's own units as data (bytes, utilisation in percent); MiB and the 0..1 ratio
are derived properties, so every consumer converts the same way (MiB floored) and none keeps a
second copy of the numbers.

"There is no GPU here" is not a fault: a node or pod without a GPU, without the NVIDIA driver,
or without ``libnvidia-ml.so.1`` makes :meth:`NvmlReader.open` raise :class:`NoGpuError` with a
message that says which it is. Everything else NVML reports (GPU lost, permissions, driver and
library mismatch) is :class:`GpuReadError`, naming the GPU and the call. The agent's CLI turns
the first into exit code 3 and the second into exit code 1; :func:`detect` turns either into one
log line and ``None`` for callers (serving) that simply run without GPU features.

This module is the shared base layer: it imports only the standard library, pynvml and
:mod:`gpufrag` base modules, never a component.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, Protocol

import pynvml

MIB = 1024 * 1024


class NoGpuError(RuntimeError):
    """No GPU to read: NVML library missing, driver not loaded, or zero devices."""


class GpuReadError(RuntimeError):
    """NVML is there but a call failed (GPU lost, driver mismatch, permissions)."""


# --- the NVML calls used, as Protocols --------------------------------------------------------


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


class DeviceAttributes(Protocol):
    """``nvmlDeviceGetAttributes`` on a MIG device: its GPU instance's compute slices (the "Ng" of
    a profile's name) and its memory."""

    @property
    def gpuInstanceSliceCount(self) -> int: ...
    @property
    def memorySizeMB(self) -> int: ...


class GpuInstancePlacement(Protocol):
    @property
    def start(self) -> int: ...
    @property
    def size(self) -> int: ...


class GpuInstanceInfo(Protocol):
    """``nvmlGpuInstanceGetInfo``: the GPU instance's profile and where it sits (memory slices)."""

    @property
    def id(self) -> int: ...
    @property
    def profileId(self) -> int: ...
    @property
    def placement(self) -> GpuInstancePlacement: ...


class GpuInstanceProfileInfo(Protocol):
    """``nvmlDeviceGetGpuInstanceProfileInfo``: a GPU instance profile's id on this GPU, its
    compute slices and memory."""

    @property
    def id(self) -> int: ...
    @property
    def sliceCount(self) -> int: ...
    @property
    def memorySizeMB(self) -> int: ...


class ComputeInstanceProfileInfo(Protocol):
    """``nvmlGpuInstanceGetComputeInstanceProfileInfo``: the profile id a compute instance is
    created with."""

    @property
    def id(self) -> int: ...


class ComputeInstanceInfo(Protocol):
    """``nvmlComputeInstanceGetInfo``: the compute instance's id in its GPU instance."""

    @property
    def id(self) -> int: ...


class NvmlApi(Protocol):
    """The pynvml calls gpufrag makes; the ``pynvml`` module itself conforms."""

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
    # MIG: the mode (current, pending), the MIG devices of a GPU, and their GPU instances.
    def nvmlDeviceGetMigMode(self, handle: object) -> Sequence[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> object: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int: ...
    def nvmlDeviceGetAttributes(self, handle: object) -> DeviceAttributes: ...
    def nvmlDeviceGetGpuInstanceById(self, handle: object, gpu_instance_id: int) -> object: ...
    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> GpuInstanceInfo: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int: ...
    # MIG instances made and destroyed (the DRA driver's partitions, gpufrag.mig_instances).
    # ``placement`` is a pointer to a ``c_nvmlGpuInstancePlacement_t``, as NVML takes it.
    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: object,
                                            profile: int) -> GpuInstanceProfileInfo: ...
    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: object, profileId: int,
                                                 placement: Any) -> object: ...
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
            self, gpu_instance: object, profile: int,
            engProfile: int) -> ComputeInstanceProfileInfo: ...
    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object,
                                             profileId: int) -> object: ...
    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: object,
                                              computeInstanceId: int) -> object: ...
    def nvmlComputeInstanceGetInfo(self, compute_instance: object) -> ComputeInstanceInfo: ...
    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> Any: ...
    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> Any: ...


# --- readings -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One process with a context on a GPU; ``pid`` is in the host's PID namespace."""

    pid: int
    memory_used_bytes: int  # 0 when the driver cannot tell

    @property
    def memory_used_mib(self) -> int:
        return self.memory_used_bytes // MIB


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Which GPU: NVML's index, its UUID and product name (they do not change while open)."""

    index: int
    uuid: str
    product: str


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """One GPU's memory alone: the cheap read (one NVML call) for a per-batch growth watch."""

    index: int
    memory_used_bytes: int
    memory_total_bytes: int

    @property
    def memory_used_mib(self) -> int:
        return self.memory_used_bytes // MIB

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // MIB


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device of a GPU in MIG mode: its GPU instance's placement and size in memory
    slices (``start``, ``slices``: NVML's ``placement``), its compute slices and profile memory
    (``nvmlDeviceGetAttributes``), its memory now and the processes on it. NVML has no
    per-instance utilisation through these calls (an H100's GPM would give one; not read)."""

    gpu_instance_id: int
    # NVML's GPU instance profile id (19 is 1g.10gb on an A100 80GB), start and size: None
    # when NVML refuses the GPU instance to this user (nvmlDeviceGetGpuInstanceById "requires
    # privileged user"); everything else here is read without privileges.
    profile_id: int | None
    uuid: str  # the MIG device's, "MIG-..."
    start: int | None
    slices: int | None
    compute_slices: int
    profile_memory_mib: int
    memory_used_bytes: int
    memory_total_bytes: int
    processes: tuple[ProcessReading, ...] = ()

    @property
    def memory_used_mib(self) -> int:
        return self.memory_used_bytes // MIB

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // MIB


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment, in NVML's units. Memory is device-wide (every process on it)."""

    index: int
    uuid: str
    product: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_pct: int  # 0..100; 0 where NVML does not support it: see utilization_supported
    processes: tuple[ProcessReading, ...] = ()  # empty when read without processes
    # False where NVML has no GPU-level figure (NotSupported: a GPU in MIG mode); the 0 above
    # is then no reading, and a consumer that can say "unknown" should.
    utilization_supported: bool = True
    mig_mode: bool = False  # NVML's current MIG mode is enabled
    mig: tuple[MigReading, ...] = ()  # by start; read only with processes, like them

    @property
    def memory_used_mib(self) -> int:
        return self.memory_used_bytes // MIB

    @property
    def memory_total_mib(self) -> int:
        return self.memory_total_bytes // MIB

    @property
    def utilization_ratio(self) -> float:
        """Busy fraction 0..1, the unit Prometheus gauges and autoscalers use."""
        return self.utilization_pct / 100.0


# --- the reader ---------------------------------------------------------------------------------


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
    """Opens NVML once and reads its GPUs on demand.

    Use as a context manager, or call :meth:`open` and :meth:`close`. :meth:`read` is the full,
    strict reading (every GPU with its processes; any failure raises); :meth:`read_gpu` and
    :meth:`read_memory` read one GPU, so a caller that would rather skip a lost GPU than fail
    (serving's metrics) can.
    """

    def __init__(self, api: NvmlApi | None = None) -> None:
        self._api = api if api is not None else load_pynvml()
        self._handles: list[object] = []
        self._open = False

    @property
    def device_count(self) -> int:
        return len(self._handles)

    @property
    def api(self) -> NvmlApi:
        """The NVML it reads through, for a writer that shares it (:mod:`gpufrag.mig_instances`)."""
        return self._api

    def open(self) -> int:
        """Initialise NVML and find the GPUs; returns how many. Raises :class:`NoGpuError`
        when there is no GPU to read, :class:`GpuReadError` when NVML fails otherwise."""
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
                raise NoGpuError("NVML found no GPU devices on this node (zero GPUs)")
            self._handles = [self._api.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.close()
            raise GpuReadError(f"NVML could not list GPUs: {exc}") from None
        except NoGpuError:
            self.close()
            raise
        return count

    def close(self) -> None:
        """Shut NVML down; safe to call twice, and never raises (it runs on the way out)."""
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

    def inventory(self) -> tuple[GpuIdentity, ...]:
        """Every GPU's index, UUID and product name, without reading memory or utilisation."""
        return tuple(self._identity(index, handle) for index, handle in self._each())

    def read(self, *, processes: bool = True) -> tuple[GpuReading, ...]:
        """Read every GPU; raises :class:`GpuReadError` naming the GPU and the failed call."""
        return tuple(self._read_gpu(index, handle, processes=processes)
                     for index, handle in self._each())

    def read_gpu(self, index: int, *, processes: bool = True) -> GpuReading:
        """Read one GPU; raises :class:`GpuReadError` naming it and the failed call."""
        return self._read_gpu(index, self._handle(index), processes=processes)

    def read_memory(self, index: int) -> MemoryReading:
        """One GPU's used and total memory: a single NVML call, no process listing, so it is
        cheap enough to run around every batch."""
        memory = self._memory(index, self._handle(index))
        return MemoryReading(index, int(memory.used), int(memory.total))

    # -- one GPU -------------------------------------------------------------------------------

    def _each(self) -> list[tuple[int, object]]:
        self._check_open()
        return list(enumerate(self._handles))

    def _handle(self, index: int) -> object:
        self._check_open()
        if not 0 <= index < len(self._handles):
            raise IndexError(f"GPU {index} does not exist; NVML found {len(self._handles)} "
                             f"(indices 0..{len(self._handles) - 1})")
        return self._handles[index]

    def _check_open(self) -> None:
        if not self._open:
            raise GpuReadError("NVML is not open; call open() first")

    def _identity(self, index: int, handle: object) -> GpuIdentity:
        try:
            uuid = nvml_text(self._api.nvmlDeviceGetUUID(handle))
            product = nvml_text(self._api.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading identity/memory failed: {exc}") from None
        return GpuIdentity(index, uuid, product)

    def _memory(self, index: int, handle: object) -> MemoryInfo:
        try:
            return self._api.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading identity/memory failed: {exc}") from None

    def _read_gpu(self, index: int, handle: object, *, processes: bool) -> GpuReading:
        # Identity and memory before utilisation: the order a recorded replay's samples assume
        # (gpufrag.nvml_recorded), and the one the agent has always used.
        identity = self._identity(index, handle)
        memory = self._memory(index, handle)
        supported = True
        try:
            utilization_pct = int(self._api.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError_NotSupported:
            utilization_pct, supported = 0, False  # e.g. MIG mode; docs/agent.md
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading utilisation failed: {exc}") from None
        mig_mode = self._mig_mode(index, handle)
        mig = self._read_mig(index, handle) if mig_mode and processes else ()
        if mig_mode:
            # Each process once, on its instance (the module docstring says why).
            found = tuple(sorted({p.pid: p for i in mig for p in i.processes}.values(),
                                 key=lambda p: p.pid))
        else:
            found = self._read_processes(index, handle) if processes else ()
        return GpuReading(
            index=index,
            uuid=identity.uuid,
            product=identity.product,
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            utilization_pct=min(max(utilization_pct, 0), 100),
            processes=found,
            utilization_supported=supported,
            mig_mode=mig_mode,
            mig=mig,
        )

    def _mig_mode(self, index: int, handle: object) -> bool:
        try:
            current = self._api.nvmlDeviceGetMigMode(handle)[0]
        except pynvml.NVMLError_NotSupported:
            return False  # not a MIG-capable GPU
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading the MIG mode failed: {exc}") from None
        return int(current) == int(pynvml.NVML_DEVICE_MIG_ENABLE)

    def _read_mig(self, index: int, handle: object) -> tuple[MigReading, ...]:
        """Every MIG device of a GPU in MIG mode, one per GPU instance, by start slice."""
        api = self._api
        found: dict[int, MigReading] = {}
        try:
            slots = api.nvmlDeviceGetMaxMigDeviceCount(handle)
            for slot in range(slots):
                try:
                    device = api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                except pynvml.NVMLError_NotFound:
                    continue  # no MIG device in this slot
                gi_id = int(api.nvmlDeviceGetGpuInstanceId(device))
                attributes = api.nvmlDeviceGetAttributes(device)
                try:
                    info: GpuInstanceInfo | None = api.nvmlGpuInstanceGetInfo(
                        api.nvmlDeviceGetGpuInstanceById(handle, gi_id))
                except pynvml.NVMLError_NoPermission:
                    info = None  # a privileged user's call: the placement stays unknown
                memory = api.nvmlDeviceGetMemoryInfo(device)
                uuid = nvml_text(api.nvmlDeviceGetUUID(device))
                if gi_id in found:
                    # A second compute instance of one GPU instance: one instance, its
                    # processes together (memory is the GPU instance's either way).
                    first = found[gi_id]
                    merged = {p.pid: p for p in (*first.processes,
                                                 *self._read_processes(index, device))}
                    found[gi_id] = replace(first, processes=tuple(
                        merged[pid] for pid in sorted(merged)))
                    continue
                found[gi_id] = MigReading(
                    gpu_instance_id=gi_id, uuid=uuid,
                    profile_id=None if info is None else int(info.profileId),
                    start=None if info is None else int(info.placement.start),
                    slices=None if info is None else int(info.placement.size),
                    compute_slices=int(attributes.gpuInstanceSliceCount),
                    profile_memory_mib=int(attributes.memorySizeMB),
                    memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
                    processes=self._read_processes(index, device))
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"GPU {index}: reading its MIG instances failed: {exc}") from None
        return tuple(sorted(found.values(), key=lambda i: (i.start is None, i.start or 0,
                                                           i.gpu_instance_id)))

    def _read_processes(self, index: int, handle: object) -> tuple[ProcessReading, ...]:
        # A process with both a compute and a graphics context shows up in both lists with the
        # same total; count it once.
        used_by_pid: dict[int, int] = {}
        for call in (self._api.nvmlDeviceGetComputeRunningProcesses,
                     self._api.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                running = call(handle)
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError as exc:
                raise GpuReadError(f"GPU {index}: listing processes failed: {exc}") from None
            for process in running:
                used = process.usedGpuMemory
                used_bytes = 0 if used is None else int(used)
                pid = int(process.pid)
                used_by_pid[pid] = max(used_by_pid.get(pid, 0), used_bytes)
        return tuple(ProcessReading(pid, used) for pid, used in sorted(used_by_pid.items()))


def nvml_text(value: str | bytes) -> str:
    """NVML's text as str."""
    # Older pynvml releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


# --- detection ----------------------------------------------------------------------------------


class EventLog(Protocol):
    """The two levels :func:`detect` logs at; a structlog bound logger conforms. Taken as a
    parameter so the line carries the caller's logger name and this base layer needs no
    logging set-up of its own."""

    def info(self, event: str, **fields: Any) -> Any: ...
    def warning(self, event: str, **fields: Any) -> Any: ...


def detect(api: NvmlApi | None = None, *, log: EventLog,
           effect: str = "GPU features off") -> NvmlReader | None:
    """An opened :class:`NvmlReader` when a GPU is usable, else ``None`` after one log line.

    For callers that run with or without a GPU (serving, the demo): no GPU is an ``info``
    ``no_gpu`` line with the reason; NVML failing on a machine that has one is a ``warning``
    ``nvml_failed`` line, since someone should look. ``effect`` says what the caller does
    without it (``"no GPU metrics, CPU backends only"``). On success one ``gpus_found`` line
    lists the products. The caller owns the reader and closes it.
    """
    reader = NvmlReader(api)
    try:
        reader.open()
        gpus = reader.inventory()
    except NoGpuError as exc:  # open() has already shut NVML down
        log.info("no_gpu", reason=f"NVML unavailable: {exc}", effect=effect)
        return None
    except GpuReadError as exc:
        reader.close()
        log.warning("nvml_failed", error=str(exc), effect=effect)
        return None
    log.info("gpus_found", count=len(gpus), products=[gpu.product for gpu in gpus])
    return reader
