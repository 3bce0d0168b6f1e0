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

A GPU in MIG mode carries ``mig``, its MIG devices (one per GPU instance) in NVML's terms;
a device without the key is not in MIG mode (``nvmlDeviceGetMigMode`` answers ``[0, 0]``;
script ``NVMLError_NotSupported`` for a GPU that has no MIG at all)::

     "mig": [{"gpu_instance_id": 1, "profile_id": 9,          # nvmlGpuInstanceGetInfo
              "start": 0, "size": 4,                          # its placement, memory slices
              "gpu_instance_slice_count": 3, "memory_size_mb": 40192,  # nvmlDeviceGetAttributes
              "uuid": "MIG-...", "memory_total": 42144366592, "memory_used": 20971520000,
              "processes": [{"pid": 4242, "used_bytes": 20971520000}]}]

A GPU in MIG mode may also carry ``gpu_instance_profiles``, the GPU instance profiles NVML
offers on it, for the calls that make and destroy MIG instances (the DRA driver's partitions,
:mod:`gpufrag.mig_instances`)::

     "gpu_instance_profiles": [{"profile": 0, "id": 19, "slice_count": 1,
                                "memory_size_mb": 9728, "size": 1,
                                "starts": [0, 1, 2, 3, 4, 5, 6]}]

They follow NVML's rules: a GPU instance only at one of its profile's ``starts``, with its
``size`` in memory slices, on slices no other instance holds (else
``NVMLError_InsufficientResources``); one compute instance per GPU instance here, spanning at
most its compute slices; a compute instance with processes on it, or a GPU instance with a
compute instance, cannot be destroyed (``NVMLError_InUse``). A new compute instance is a new
entry of ``mig`` (its uuid ``MIG-<n>``, ids the lowest free), so the reading calls see it.

MIG device ``i`` of ``nvmlDeviceGetMigDeviceHandleByIndex`` is ``mig[i]`` (slots past the list up
to :data:`MAX_MIG_DEVICES` raise ``NVMLError_NotFound``, as an empty slot does); its readings
do not change with time. On a MIG device handle, utilisation and graphics processes raise
``NVMLError_NotSupported``. A device's ``errors`` script covers its MIG devices' calls too.

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
from collections.abc import Callable, Mapping, Sequence
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
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceById",
    "nvmlGpuInstanceGetInfo",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetGpuInstanceProfileInfo",
    "nvmlDeviceCreateGpuInstanceWithPlacement",
    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
    "nvmlGpuInstanceCreateComputeInstance",
    "nvmlGpuInstanceGetComputeInstanceById",
    "nvmlComputeInstanceGetInfo",
    "nvmlComputeInstanceDestroy",
    "nvmlGpuInstanceDestroy",
)
# Compute slices of each compute instance profile (pynvml's NVML_COMPUTE_INSTANCE_PROFILE_*).
COMPUTE_PROFILE_SLICES = {pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
                          pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
                          pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
                          pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
                          pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7}
MIB = 1 << 20
MAX_MIG_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount of an A100 or H100 in MIG mode
MIG_SLICES = 8  # memory slices of a MIG-capable GPU: a placement ends by slice 8
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
class RecordedMigDevice:
    """One MIG device of a GPU in MIG mode: its GPU instance (id, profile id, placement), the
    attributes NVML gives its handle, and its memory and processes (fixed over time)."""

    gpu_instance_id: int
    profile_id: int
    uuid: str
    start: int
    size: int  # memory slices
    gpu_instance_slice_count: int  # compute slices
    memory_size_mb: int
    memory_total_bytes: int
    memory_used_bytes: int
    processes: list[RecordedProcess] = field(default_factory=list)
    compute_instance_id: int = 0


@dataclass(frozen=True, slots=True)
class RecordedGpuInstanceProfile:
    """A GPU instance profile NVML offers on a GPU in MIG mode: ``profile`` is pynvml's
    ``NVML_GPU_INSTANCE_PROFILE_*`` index, ``id`` the id NVML gives it on this GPU."""

    profile: int
    id: int
    slice_count: int  # compute slices
    memory_size_mb: int
    size: int  # memory slices
    starts: tuple[int, ...]


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
    mig: list[RecordedMigDevice] | None = None  # None: not in MIG mode
    gpu_instance_profiles: list[RecordedGpuInstanceProfile] = field(default_factory=list)


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
class _Attributes:
    gpuInstanceSliceCount: int
    memorySizeMB: int


@dataclass(frozen=True, slots=True)
class _Placement:
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class _GpuInstanceInfo:
    id: int
    profileId: int
    placement: _Placement


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


@dataclass(frozen=True, slots=True)
class _MigHandle:
    index: int  # the GPU's
    slot: int  # MIG device index on it


@dataclass(frozen=True, slots=True)
class _GpuInstance:
    index: int
    gpu_instance_id: int


@dataclass(frozen=True, slots=True)
class _ComputeInstance:
    index: int
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True, slots=True)
class _GpuInstanceProfileInfo:
    id: int
    sliceCount: int
    memorySizeMB: int


@dataclass(frozen=True, slots=True)
class _IdInfo:
    """What NVML answers where only an id is read: a compute instance profile's, or a
    compute instance's."""

    id: int


@dataclass(frozen=True, slots=True)
class _GpuInstanceState:
    """A GPU instance that exists (with or without a compute instance)."""

    profile_id: int
    start: int
    size: int


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
        # GPU -> GPU instance id -> its profile and placement: the recording's MIG devices,
        # then what the MIG calls make and destroy.
        self.gpu_instances: dict[int, dict[int, _GpuInstanceState]] = {
            index: {m.gpu_instance_id: _GpuInstanceState(m.profile_id, m.start, m.size)
                    for m in device.mig or ()}
            for index, device in enumerate(self.devices)}
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
        device = self._device(handle, "nvmlDeviceGetUUID")
        mig = self._mig_device(handle)
        return device.uuid if mig is None else mig.uuid

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _Memory:
        device = self._device(handle, "nvmlDeviceGetMemoryInfo")
        mig = self._mig_device(handle)
        if mig is not None:
            return _Memory(used=mig.memory_used_bytes, total=mig.memory_total_bytes,
                           free=mig.memory_total_bytes - mig.memory_used_bytes)
        index = _index(handle)
        if index in self._memory_read and len(device.samples) > 1:
            device.samples.pop(0)  # time moves on: the next sample is now
        self._memory_read.add(index)
        total = device.memory_total_bytes
        used = device.samples[0].memory_used_bytes
        return _Memory(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization:
        device = self._device(handle, "nvmlDeviceGetUtilizationRates")
        if isinstance(handle, _MigHandle):
            raise pynvml.NVMLError_NotSupported()
        return _Utilization(gpu=device.samples[0].utilization_pct)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[_Process]:
        device = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        mig = self._mig_device(handle)
        running = device.processes if mig is None else mig.processes
        return [_Process(p.pid, p.used_bytes) for p in running]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: object) -> list[_Process]:
        device = self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        if isinstance(handle, _MigHandle):
            raise pynvml.NVMLError_NotSupported()
        return [_Process(p.pid, p.used_bytes) for p in device.graphics_processes]

    # -- MIG ------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: object) -> list[int]:
        device = self._gpu(handle, "nvmlDeviceGetMigMode")
        enabled = device.mig is not None
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]  # current, pending

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object) -> int:
        device = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        return 0 if device.mig is None else MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int) -> object:
        device = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if device.mig is None or not 0 <= index < MAX_MIG_DEVICES:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(device.mig):
            raise pynvml.NVMLError_NotFound()
        return _MigHandle(_index(handle), index)

    def nvmlDeviceGetGpuInstanceId(self, handle: object) -> int:
        return self._mig_only(handle, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetAttributes(self, handle: object) -> _Attributes:
        mig = self._mig_only(handle, "nvmlDeviceGetAttributes")
        return _Attributes(mig.gpu_instance_slice_count, mig.memory_size_mb)

    def nvmlDeviceGetGpuInstanceById(self, handle: object, gpu_instance_id: int) -> object:
        device = self._gpu(handle, "nvmlDeviceGetGpuInstanceById")
        if device.mig is None:
            raise pynvml.NVMLError_NotSupported()
        if gpu_instance_id not in self.gpu_instances[_index(handle)]:
            raise pynvml.NVMLError_NotFound()
        return _GpuInstance(_index(handle), gpu_instance_id)

    def nvmlGpuInstanceGetInfo(self, gpu_instance: object) -> _GpuInstanceInfo:
        gi, state = self._gpu_instance(gpu_instance, "nvmlGpuInstanceGetInfo")
        return _GpuInstanceInfo(gi.gpu_instance_id, state.profile_id,
                                _Placement(state.start, state.size))

    def nvmlDeviceGetComputeInstanceId(self, handle: object) -> int:
        return self._mig_only(handle, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    # -- MIG instances made and destroyed -------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: object,
                                            profile: int) -> _GpuInstanceProfileInfo:
        found = self._offered(handle, "nvmlDeviceGetGpuInstanceProfileInfo",
                              lambda p: p.profile == profile)
        return _GpuInstanceProfileInfo(found.id, found.slice_count, found.memory_size_mb)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: object, profileId: int,
                                                 placement: Any) -> object:
        found = self._offered(handle, "nvmlDeviceCreateGpuInstanceWithPlacement",
                              lambda p: p.id == profileId)
        start, size = int(placement.contents.start), int(placement.contents.size)
        if start not in found.starts or size != found.size:
            raise pynvml.NVMLError_InvalidArgument()
        instances = self.gpu_instances[_index(handle)]
        wanted = set(range(start, start + size))
        if any(wanted & set(range(gi.start, gi.start + gi.size)) for gi in instances.values()):
            raise pynvml.NVMLError_InsufficientResources()
        gi_id = min(set(range(1, len(instances) + 2)) - set(instances))
        instances[gi_id] = _GpuInstanceState(profileId, start, size)
        return _GpuInstance(_index(handle), gi_id)

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
            self, gpu_instance: object, profile: int,
            engProfile: int) -> _IdInfo:
        gi, state = self._gpu_instance(gpu_instance,
                                       "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        slices = COMPUTE_PROFILE_SLICES.get(profile)
        if slices is None or slices > self._profile_of(gi.index, state).slice_count:
            raise pynvml.NVMLError_NotSupported()
        return _IdInfo(profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gpu_instance: object,
                                             profileId: int) -> object:
        gi, state = self._gpu_instance(gpu_instance, "nvmlGpuInstanceCreateComputeInstance")
        index, gi_id = gi.index, gi.gpu_instance_id
        device = self.devices[index]
        migs = device.mig if device.mig is not None else []
        if any(m.gpu_instance_id == gi_id for m in migs) or len(migs) >= MAX_MIG_DEVICES:
            raise pynvml.NVMLError_InsufficientResources()
        profile = self._profile_of(index, state)
        taken = {m.uuid for d in self.devices for m in d.mig or ()}
        uuid = next(f"MIG-{n}" for n in range(1, len(taken) + 2) if f"MIG-{n}" not in taken)
        memory = profile.memory_size_mb * MIB
        migs.append(RecordedMigDevice(
            gi_id, state.profile_id, uuid, state.start, state.size,
            COMPUTE_PROFILE_SLICES.get(profileId, profile.slice_count),
            profile.memory_size_mb, memory, 0))
        return _ComputeInstance(index, gi_id, 0)

    def nvmlGpuInstanceGetComputeInstanceById(self, gpu_instance: object,
                                              computeInstanceId: int) -> object:
        gi, _ = self._gpu_instance(gpu_instance, "nvmlGpuInstanceGetComputeInstanceById")
        if self._compute(gi.index, gi.gpu_instance_id, computeInstanceId) is None:
            raise pynvml.NVMLError_NotFound()
        return _ComputeInstance(gi.index, gi.gpu_instance_id, computeInstanceId)

    def nvmlComputeInstanceGetInfo(self, compute_instance: object) -> _IdInfo:
        _, mig = self._compute_instance(compute_instance, "nvmlComputeInstanceGetInfo")
        return _IdInfo(mig.compute_instance_id)

    def nvmlComputeInstanceDestroy(self, compute_instance: object) -> int:
        ci, mig = self._compute_instance(compute_instance, "nvmlComputeInstanceDestroy")
        if mig.processes:
            raise pynvml.NVMLError_InUse()
        (self.devices[ci.index].mig or []).remove(mig)
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpuInstanceDestroy(self, gpu_instance: object) -> int:
        gi, _ = self._gpu_instance(gpu_instance, "nvmlGpuInstanceDestroy")
        if any(m.gpu_instance_id == gi.gpu_instance_id for m in self.devices[gi.index].mig or ()):
            raise pynvml.NVMLError_InUse()
        del self.gpu_instances[gi.index][gi.gpu_instance_id]
        return int(pynvml.NVML_SUCCESS)

    def _offered(self, handle: object, call: str,
                 match: Callable[[RecordedGpuInstanceProfile], bool]
                 ) -> RecordedGpuInstanceProfile:
        """The GPU instance profile ``match`` picks on a GPU in MIG mode."""
        device = self._gpu(handle, call)
        found = next((p for p in device.gpu_instance_profiles if match(p)), None)
        if device.mig is None or found is None:
            raise pynvml.NVMLError_NotSupported()
        return found

    def _profile_of(self, index: int, state: _GpuInstanceState) -> RecordedGpuInstanceProfile:
        return next(p for p in self.devices[index].gpu_instance_profiles
                    if p.id == state.profile_id)

    def _gpu_instance(self, gpu_instance: object,
                      call: str) -> tuple[_GpuInstance, _GpuInstanceState]:
        """A GPU instance handle that must still exist (a stale one is InvalidArgument)."""
        if not isinstance(gpu_instance, _GpuInstance):
            raise TypeError(f"not a GPU instance of this RecordedNvml: {gpu_instance!r}")
        self._device(_Handle(gpu_instance.index), call)
        state = self.gpu_instances[gpu_instance.index].get(gpu_instance.gpu_instance_id)
        if state is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu_instance, state

    def _compute(self, index: int, gi_id: int, ci_id: int) -> RecordedMigDevice | None:
        return next((m for m in self.devices[index].mig or ()
                     if (m.gpu_instance_id, m.compute_instance_id) == (gi_id, ci_id)), None)

    def _compute_instance(self, compute_instance: object,
                          call: str) -> tuple[_ComputeInstance, RecordedMigDevice]:
        if not isinstance(compute_instance, _ComputeInstance):
            raise TypeError(f"not a compute instance of this RecordedNvml: {compute_instance!r}")
        self._device(_Handle(compute_instance.index), call)
        found = self._compute(compute_instance.index, compute_instance.gpu_instance_id,
                              compute_instance.compute_instance_id)
        if found is None:
            raise pynvml.NVMLError_InvalidArgument()
        return compute_instance, found

    def _gpu(self, handle: object, call: str) -> RecordedDevice:
        """A call NVML takes on a GPU's own handle only."""
        if isinstance(handle, _MigHandle):
            self._called(call)
            raise pynvml.NVMLError_InvalidArgument()
        return self._device(handle, call)

    def _mig_only(self, handle: object, call: str) -> RecordedMigDevice:
        """A call answered here for a MIG device's handle only."""
        self._device(handle, call)
        mig = self._mig_device(handle)
        if mig is None:
            raise pynvml.NVMLError_InvalidArgument()
        return mig

    def _mig_device(self, handle: object) -> RecordedMigDevice | None:
        if not isinstance(handle, _MigHandle):
            return None
        return (self.devices[handle.index].mig or [])[handle.slot]

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
    if not isinstance(handle, _Handle | _MigHandle):
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
        _check_processes(processes, f"{at}.{key}", source=source)
    if device.mig is not None:
        _check_mig(device.mig, f"{at}.mig", source=source)
    for call, script in device.errors.items():
        if call not in DEVICE_CALLS:
            raise BadInput(f"{call!r} is not a per-device NVML call; one of "
                           f"{', '.join(DEVICE_CALLS)}", source=source, field=f"{at}.errors")
        for i, name in enumerate(script):
            if name is not None:
                _error_class(name, source=source, at=f"{at}.errors.{call}[{i}]")


def _check_mig(migs: Sequence[RecordedMigDevice], at: str, *, source: str) -> None:
    """MIG devices real NVML could report: placements inside the GPU's slices, no two GPU
    instances overlapping (entries with one ``gpu_instance_id`` are compute instances of one
    GPU instance, so they share its placement), uuids unique, memory in range."""
    if len(migs) > MAX_MIG_DEVICES:
        raise BadInput(f"{len(migs)} MIG devices; a GPU has at most {MAX_MIG_DEVICES}",
                       source=source, field=at)
    taken: set[int] = set()
    seen_ids: dict[int, tuple[int, int]] = {}  # GPU instance id -> (start, size)
    seen_uuids: set[str] = set()
    for i, mig in enumerate(migs):
        where = f"{at}[{i}]"
        if mig.start < 0 or mig.size < 1 or mig.start + mig.size > MIG_SLICES:
            raise BadInput(f"start {mig.start} and size {mig.size} must lie in slices "
                           f"0..{MIG_SLICES - 1}", source=source, field=f"{where}.start")
        placement = seen_ids.get(mig.gpu_instance_id)
        if placement is not None and placement != (mig.start, mig.size):
            # Another compute instance of a GPU instance listed already: same placement.
            raise BadInput(f"GPU instance {mig.gpu_instance_id} is at start {placement[0]}, "
                           f"size {placement[1]} already", source=source,
                           field=f"{where}.gpu_instance_id")
        slices = set(range(mig.start, mig.start + mig.size))
        if placement is None and slices & taken:
            raise BadInput(f"slices {sorted(slices & taken)} are taken by another instance",
                           source=source, field=f"{where}.start")
        taken |= slices
        seen_ids[mig.gpu_instance_id] = (mig.start, mig.size)
        if mig.uuid in seen_uuids:
            raise BadInput(f"{mig.uuid!r} repeats", source=source, field=f"{where}.uuid")
        seen_uuids.add(mig.uuid)
        if not 1 <= mig.gpu_instance_slice_count <= MAX_MIG_DEVICES:
            raise BadInput(f"{mig.gpu_instance_slice_count} must be in 1..{MAX_MIG_DEVICES}",
                           source=source, field=f"{where}.gpu_instance_slice_count")
        for key, value in (("memory_size_mb", mig.memory_size_mb),
                           ("memory_total", mig.memory_total_bytes)):
            if value <= 0:
                raise BadInput(f"{value} must be > 0", source=source, field=f"{where}.{key}")
        if not 0 <= mig.memory_used_bytes <= mig.memory_total_bytes:
            raise BadInput(f"{mig.memory_used_bytes} must be in 0..memory_total "
                           f"({mig.memory_total_bytes}) bytes", source=source,
                           field=f"{where}.memory_used")
        _check_processes(mig.processes, f"{where}.processes", source=source)


def _check_processes(processes: Sequence[RecordedProcess], at: str, *, source: str) -> None:
    for i, process in enumerate(processes):
        if process.pid < 0:
            raise BadInput(f"{process.pid} must be a pid >= 0", source=source,
                           field=f"{at}[{i}].pid")
        if process.used_bytes is not None and process.used_bytes < 0:
            raise BadInput(f"{process.used_bytes} must be >= 0 bytes or null",
                           source=source, field=f"{at}[{i}].used_bytes")


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
        mig=None if "mig" not in raw else [
            _mig_from_json(m, f"{at}.mig[{i}]", source)
            for i, m in enumerate(_list(raw, "mig", at, source, required=True))],
        gpu_instance_profiles=[
            _gi_profile_from_json(p, f"{at}.gpu_instance_profiles[{i}]", source)
            for i, p in enumerate(_list(raw, "gpu_instance_profiles", at, source,
                                        required=False))],
    )


def _gi_profile_from_json(raw: object, at: str, source: str) -> RecordedGpuInstanceProfile:
    if not isinstance(raw, Mapping):
        raise BadInput("must be an object with profile, id, slice_count, memory_size_mb, size "
                       "and starts", source=source, field=at)
    starts = _list(raw, "starts", at, source, required=True)
    if not starts or not all(isinstance(s, int) and not isinstance(s, bool) for s in starts):
        raise BadInput(f"{starts!r} must be a non-empty list of slice numbers", source=source,
                       field=f"{at}.starts")
    return RecordedGpuInstanceProfile(
        profile=_int(raw, "profile", at, source), id=_int(raw, "id", at, source),
        slice_count=_int(raw, "slice_count", at, source),
        memory_size_mb=_int(raw, "memory_size_mb", at, source),
        size=_int(raw, "size", at, source), starts=tuple(starts))


def _mig_from_json(raw: object, at: str, source: str) -> RecordedMigDevice:
    if not isinstance(raw, Mapping):
        raise BadInput("must be an object with gpu_instance_id, profile_id, uuid, start, size, "
                       "gpu_instance_slice_count, memory_size_mb, memory_total and memory_used",
                       source=source, field=at)
    return RecordedMigDevice(
        gpu_instance_id=_int(raw, "gpu_instance_id", at, source),
        profile_id=_int(raw, "profile_id", at, source),
        uuid=_str(raw, "uuid", at, source),
        start=_int(raw, "start", at, source),
        size=_int(raw, "size", at, source),
        gpu_instance_slice_count=_int(raw, "gpu_instance_slice_count", at, source),
        memory_size_mb=_int(raw, "memory_size_mb", at, source),
        memory_total_bytes=_int(raw, "memory_total", at, source),
        memory_used_bytes=_int(raw, "memory_used", at, source),
        processes=_processes(raw, "processes", at, source),
        compute_instance_id=(_int(raw, "compute_instance_id", at, source)
                             if "compute_instance_id" in raw else 0),
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
