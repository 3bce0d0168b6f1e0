"""Recorded NVML: the pynvml calls gpufrag makes, answered from a recording instead of a GPU.

This is product code, not only a test double: it is the "recorded inventory mode" of
everything that reads GPUs where none exists (the demo's node agent, a device plugin on a
laptop or in CI), and the one fake every test uses. :class:`RecordedNvml` conforms to
:class:`gpufrag.nvml.NvmlApi`, so it goes wherever ``pynvml`` goes, and it fails the way NVML
fails: with the real pynvml exception classes (``pynvml.NVMLError_GpuIsLost`` and the rest exist
without the library), so :class:`gpufrag.nvml.NvmlReader` maps them exactly as it maps real ones.

A recording is JSON, in NVML's units and names::

    {"init_error": "NVMLError_LibraryNotFound",            # optional: nvmlInit raises it
     "devices": [{
        "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "memory_total": 85520809984,
        "samples": [{"gpu": 87, "memory_used": 21474836480}, ...],     # utilisation %, bytes
        "processes": [{"pid": 4242, "used_bytes": 20971520000}],        # optional, compute
        "graphics_processes": [{"pid": 7070, "used_bytes": null}],     # optional
        "errors": {"nvmlDeviceGetMemoryInfo": ["NVMLError_GpuIsLost", null]}   # optional
     }]}

Time in a recording moves with memory reads, since that is what a growth watch compares: the
first ``nvmlDeviceGetMemoryInfo`` of a device answers from ``samples[0]`` and each later one
moves to the next sample; utilisation answers from the sample the latest memory read used (so
read memory first, as :class:`~gpufrag.nvml.NvmlReader` does). ``errors`` scripts a device's
calls: each call of the named function takes the next entry, a pynvml error class name to raise
or ``null`` to answer normally (a single name means every call). In both lists the last entry
repeats. Process lists and identity do not change with time.

The fake keeps its own copy of what it is given, so one recording can seed many fakes; a test
that wants the next answers to differ edits ``fake.devices`` (the remaining script) directly.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pynvml

from gpufrag.errors import BadInput
from gpufrag.nvml import NvmlApi

# Every per-device call NvmlApi names: the ones a recording may script errors for.
DEVICE_CALLS = (
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
)
CALL_HISTORY = 1000  # calls kept in RecordedNvml.calls, so a long replay stays bounded


# --- the recording, as data ---------------------------------------------------------------------


@dataclass(slots=True)
class RecordedSample:
    """One moment of one GPU: utilisation in percent (NVML's ``gpu``) and used memory."""

    utilization_pct: int
    memory_used_bytes: int


@dataclass(slots=True)
class RecordedProcess:
    """A process with a context on the GPU; ``used_bytes`` None when the driver cannot tell."""

    pid: int
    used_bytes: int | None


@dataclass(slots=True)
class RecordedDevice:
    """One GPU's recorded answers. ``uuid`` and ``name`` may be bytes, as older pynvml
    releases return them. Mutable on purpose: the lists are the script still to come."""

    name: str | bytes
    uuid: str | bytes
    memory_total_bytes: int
    samples: list[RecordedSample]
    processes: list[RecordedProcess] = field(default_factory=list)  # compute contexts
    graphics_processes: list[RecordedProcess] = field(default_factory=list)
    # NvmlApi function name -> per call, a pynvml error class name to raise or None to answer.
    errors: dict[str, list[str | None]] = field(default_factory=dict)


# --- what the calls return (pynvml's struct field names) -----------------------------------------


@dataclass(frozen=True, slots=True)
class _Memory:
    used: int
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class _Utilization:
    gpu: int
    memory: int = 0


@dataclass(frozen=True, slots=True)
class _Process:
    pid: int
    usedGpuMemory: int | None  # NVML's name


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


# --- the fake NVML ------------------------------------------------------------------------------


class RecordedNvml:
    """The pynvml calls :class:`gpufrag.nvml.NvmlApi` names, answered from recorded devices.

    Like NVML, every call but ``nvmlInit`` raises ``NVMLError_Uninitialized`` unless NVML is
    initialised (init and shutdown are counted, as NVML counts them). ``calls`` lists the calls
    made, most recent last (the latest :data:`CALL_HISTORY` at least), for tests to assert on.
    A device NVML could never report is :class:`~gpufrag.errors.BadInput` naming the field
    under ``source`` (where the recording came from).
    """

    def __init__(self, devices: Sequence[RecordedDevice] = (), *,
                 init_error: str | None = None, source: str = "RecordedNvml") -> None:
        self.devices = [copy.deepcopy(device) for device in devices]
        self.init_error = init_error
        self.calls: list[str] = []
        self._inits = 0
        self._memory_read: set[int] = set()  # devices whose samples[0] a memory read has used
        for index, device in enumerate(self.devices):
            _check_device(device, f"devices[{index}]", source=source)
        if init_error is not None:
            _error_class(init_error, source=source, at="init_error")

    @classmethod
    def from_recording(cls, recording: Mapping[str, Any], *,
                       source: str = "recording") -> RecordedNvml:
        """Build from a parsed JSON recording (format in the module docstring); raises
        :class:`~gpufrag.errors.BadInput` naming the field to fix."""
        if not isinstance(recording, Mapping):
            raise BadInput("a recording is a JSON object with a 'devices' list", source=source)
        devices = recording.get("devices", [])
        if not isinstance(devices, list):
            raise BadInput("must be a list of devices", source=source, field="devices")
        init_error = recording.get("init_error")
        if init_error is not None and not isinstance(init_error, str):
            raise BadInput(f"{init_error!r} must be a pynvml error class name such as "
                           "'NVMLError_LibraryNotFound'", source=source, field="init_error")
        return cls([_device_from_json(d, f"devices[{i}]", source) for i, d in enumerate(devices)],
                   init_error=init_error, source=source)

    @classmethod
    def load(cls, path: Path | str) -> RecordedNvml:
        """Read a JSON recording file; a bad file is :class:`~gpufrag.errors.BadInput`."""
        path = Path(path)
        try:
            # orjson: its nesting limit (1,024) refuses a deeply nested file as bad JSON,
            # where the standard library's parser recursed into a RecursionError.
            recording = orjson.loads(path.read_bytes())
        except OSError as exc:
            raise BadInput(f"cannot read the NVML recording: {exc.strerror}",
                           source=str(path)) from None
        except orjson.JSONDecodeError as exc:
            raise BadInput(f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                           source=str(path)) from None
        return cls.from_recording(recording, source=str(path))

    # -- NvmlApi --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._called("nvmlInit")
        if self.init_error is not None:
            raise _error_class(self.init_error)()
        self._inits += 1

    def nvmlShutdown(self) -> None:
        self._called("nvmlShutdown")
        self._check_initialised()
        self._inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._called("nvmlDeviceGetCount")
        self._check_initialised()
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        self._called("nvmlDeviceGetHandleByIndex")
        self._check_initialised()
        if not 0 <= index < len(self.devices):
            raise pynvml.NVMLError_InvalidArgument()
        self._scripted_error(index, "nvmlDeviceGetHandleByIndex")
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        return self._device(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _Memory:
        device = self._device(handle, "nvmlDeviceGetMemoryInfo")
        index = _index(handle)
        if index in self._memory_read and len(device.samples) > 1:
            device.samples.pop(0)  # time moves on: the next sample is now
        self._memory_read.add(index)
        total = device.memory_total_bytes
        used = device.samples[0].memory_used_bytes
        return _Memory(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization:
        device = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return _Utilization(gpu=device.samples[0].utilization_pct)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_Process]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [_Process(p.pid, p.used_bytes) for p in device.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[_Process]:
        device = self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return [_Process(p.pid, p.used_bytes) for p in device.graphics_processes]

    # -- bookkeeping ----------------------------------------------------------------------------

    def _called(self, name: str) -> None:
        self.calls.append(name)
        if len(self.calls) >= 2 * CALL_HISTORY:
            del self.calls[:CALL_HISTORY]  # amortised: trim in halves, not on every call

    def _check_initialised(self) -> None:
        if self._inits <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _device(self, handle: object, call: str) -> RecordedDevice:
        self._called(call)
        self._check_initialised()
        index = _index(handle)
        self._scripted_error(index, call)
        return self.devices[index]

    def _scripted_error(self, index: int, call: str) -> None:
        script = self.devices[index].errors.get(call)
        if not script:
            return
        name = script[0] if len(script) == 1 else script.pop(0)
        if name is not None:
            raise _error_class(name)()


def _conforms(api: RecordedNvml) -> NvmlApi:
    return api  # mypy: RecordedNvml implements the NvmlApi Protocol


def _index(handle: object) -> int:
    if not isinstance(handle, _Handle):
        raise TypeError(f"not a handle of this RecordedNvml: {handle!r}")
    return handle.index


def _error_class(name: str, *, source: str = "RecordedNvml",
                 at: str = "errors") -> type[Exception]:
    error = getattr(pynvml, name, None) if name.startswith("NVMLError_") else None
    if not (isinstance(error, type) and issubclass(error, pynvml.NVMLError)):
        raise BadInput(f"{name!r} is not a pynvml error class; use one such as "
                       "'NVMLError_GpuIsLost' or 'NVMLError_NotSupported'", source=source,
                       field=at)
    return error


def _check_device(device: RecordedDevice, at: str, *, source: str) -> None:
    """Reject what real NVML could never answer, naming the field, at construction."""
    if not device.samples:
        raise BadInput("needs at least one sample", source=source, field=f"{at}.samples")
    if device.memory_total_bytes <= 0:
        raise BadInput(f"{device.memory_total_bytes} must be > 0 bytes", source=source,
                       field=f"{at}.memory_total")
    for i, sample in enumerate(device.samples):
        if not 0 <= sample.utilization_pct <= 100:
            raise BadInput(f"{sample.utilization_pct} must be a percentage in 0..100",
                           source=source, field=f"{at}.samples[{i}].gpu")
        if not 0 <= sample.memory_used_bytes <= device.memory_total_bytes:
            raise BadInput(f"{sample.memory_used_bytes} must be in 0..memory_total "
                           f"({device.memory_total_bytes}) bytes", source=source,
                           field=f"{at}.samples[{i}].memory_used")
    for key, processes in (("processes", device.processes),
                           ("graphics_processes", device.graphics_processes)):
        for i, process in enumerate(processes):
            if process.pid < 0:
                raise BadInput(f"{process.pid} must be a pid >= 0", source=source,
                               field=f"{at}.{key}[{i}].pid")
            if process.used_bytes is not None and process.used_bytes < 0:
                raise BadInput(f"{process.used_bytes} must be >= 0 bytes or null",
                               source=source, field=f"{at}.{key}[{i}].used_bytes")
    for call, script in device.errors.items():
        if call not in DEVICE_CALLS:
            raise BadInput(f"{call!r} is not a per-device NVML call; one of "
                           f"{', '.join(DEVICE_CALLS)}", source=source, field=f"{at}.errors")
        for i, name in enumerate(script):
            if name is not None:
                _error_class(name, source=source, at=f"{at}.errors.{call}[{i}]")


# --- JSON -> data -------------------------------------------------------------------------------


def _device_from_json(raw: object, at: str, source: str) -> RecordedDevice:
    if not isinstance(raw, Mapping):
        raise BadInput("must be an object with name, uuid, memory_total and samples",
                       source=source, field=at)
    samples_raw = _list(raw, "samples", at, source, required=True)
    samples = []
    for i, sample in enumerate(samples_raw):
        where = f"{at}.samples[{i}]"
        if not isinstance(sample, Mapping):
            raise BadInput("must be an object with 'gpu' and 'memory_used'", source=source,
                           field=where)
        samples.append(RecordedSample(_int(sample, "gpu", where, source),
                                      _int(sample, "memory_used", where, source)))
    errors: dict[str, list[str | None]] = {}
    errors_raw = raw.get("errors", {})
    if not isinstance(errors_raw, Mapping):
        raise BadInput("must map an NVML call to an error name or a list of them",
                       source=source, field=f"{at}.errors")
    for call, script in errors_raw.items():
        entries = [script] if isinstance(script, str) else script
        if not (isinstance(entries, list) and entries
                and all(e is None or isinstance(e, str) for e in entries)):
            raise BadInput(f"{script!r} must be a pynvml error class name, or a non-empty list "
                           "of them and nulls", source=source, field=f"{at}.errors.{call}")
        errors[str(call)] = list(entries)
    return RecordedDevice(
        name=_str(raw, "name", at, source),
        uuid=_str(raw, "uuid", at, source),
        memory_total_bytes=_int(raw, "memory_total", at, source),
        samples=samples,
        processes=_processes(raw, "processes", at, source),
        graphics_processes=_processes(raw, "graphics_processes", at, source),
        errors=errors,
    )


def _processes(raw: Mapping[str, Any], key: str, at: str, source: str) -> list[RecordedProcess]:
    found = []
    for i, process in enumerate(_list(raw, key, at, source, required=False)):
        where = f"{at}.{key}[{i}]"
        if not isinstance(process, Mapping):
            raise BadInput("must be an object with 'pid' and 'used_bytes'", source=source,
                           field=where)
        used = process.get("used_bytes")
        found.append(RecordedProcess(_int(process, "pid", where, source),
                                     None if used is None else _int(process, "used_bytes",
                                                                    where, source)))
    return found


def _list(raw: Mapping[str, Any], key: str, at: str, source: str, *,
          required: bool) -> list[Any]:
    if key not in raw and not required:
        return []
    value = raw.get(key)
    if not isinstance(value, list):
        raise BadInput(f"{value!r} must be a list", source=source, field=f"{at}.{key}")
    return value


def _int(raw: Mapping[str, Any], key: str, at: str, source: str) -> int:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{value!r} must be an integer", source=source, field=f"{at}.{key}")
    return value


def _str(raw: Mapping[str, Any], key: str, at: str, source: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise BadInput(f"{value!r} must be a non-empty string", source=source,
                       field=f"{at}.{key}")
    return value
