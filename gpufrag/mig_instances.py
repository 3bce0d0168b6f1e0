"""Make and destroy MIG instances through NVML: the writing half of the shared NVML adapter.

The DRA driver hands out MIG partitions that kube-scheduler allocated at a placement (a
profile at a start slice, docs/dra.md); preparing one means creating the GPU instance at
exactly that placement (``nvmlDeviceCreateGpuInstanceWithPlacement``), a compute instance
that spans it (``nvmlGpuInstanceCreateComputeInstance``) and reading the MIG device's UUID,
which is what the container is given. Unpreparing destroys both.

Both are idempotent, because the kubelet repeats its calls after a timeout or a restart of
either side:

- :meth:`MigInstances.ensure` takes the GPU instance id a caller recorded from an earlier
  try (the driver keeps one per claim) and uses that instance when it is still there at that
  placement; without one it looks for a MIG device already at the placement (an instance
  made by a try whose record was lost) before it creates anything, and the same for the
  compute instance;
- :meth:`MigInstances.destroy` treats an instance already gone as destroyed.

Every call is public pynvml (``gpufrag.nvml.NvmlApi`` names them); the recorded stand-in
(:class:`gpufrag.nvml_recorded.RecordedNvml`) enforces the same placement rules, which is
how this is tested: no GPU is on the machines the tests run on. Profiles are matched by what
NVML reports of them (compute slices, then the nearest memory), so no NVML profile id is
written down here: a ``3g.40gb`` is the profile with 3 compute slices whose memory is
nearest 40 GB on this GPU, whatever id the driver gives it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pynvml

from gpufrag.nvml import GpuReadError, NvmlApi, nvml_text

# The GPU instance profiles with one compute instance each and no media-engine variant: the
# shapes scheduler.core.mig models (1g with one and with two memory slices, 2g, 3g, 4g, 7g).
GPU_INSTANCE_PROFILES = (
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
    pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE,
    pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE,
)
# The compute instance profile that spans a GPU instance of so many compute slices.
COMPUTE_INSTANCE_PROFILES = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


class MigWriteError(GpuReadError):
    """A MIG instance could not be made or destroyed; the message names the GPU, the
    placement and NVML's answer."""


@dataclass(frozen=True, slots=True)
class MigShape:
    """What to make: ``compute_slices`` (the "Ng") and ``memory_mib`` pick the profile,
    ``start`` and ``slices`` (memory slices) the placement."""

    compute_slices: int
    memory_mib: int
    start: int
    slices: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG instance that exists: its GPU instance and compute instance ids and the MIG
    device's UUID (``MIG-...``, what ``NVIDIA_VISIBLE_DEVICES`` names)."""

    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str


class MigInstances:
    """MIG instances on the GPUs of an open NVML (``NvmlReader.api``)."""

    def __init__(self, api: NvmlApi) -> None:
        self._api = api

    def ensure(self, gpu_index: int, shape: MigShape, *, gpu_instance_id: int | None = None,
               on_created: Callable[[int], None] | None = None) -> MigDevice:
        """The MIG device at ``shape``'s placement, made where it is not there yet (module
        docstring); :class:`MigWriteError` naming the placement when NVML refuses.
        ``on_created`` is called with a new GPU instance's id before its compute instance is
        made, so the caller can record it first."""
        where = (f"GPU {gpu_index}: MIG instance of {shape.compute_slices} compute slices at "
                 f"memory slice {shape.start}")
        api = self._api
        try:
            handle = api.nvmlDeviceGetHandleByIndex(gpu_index)
            profile = self._profile(handle, shape, where)
            instance = self._recorded(handle, gpu_instance_id, profile.id, shape)
            if instance is None:
                instance = self._found_at(handle, profile.id, shape)
            if instance is None:
                placement = pynvml.c_nvmlGpuInstancePlacement_t(shape.start, shape.slices)
                instance = api.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, profile.id, ctypes.pointer(placement))
                if on_created is not None:
                    on_created(int(api.nvmlGpuInstanceGetInfo(instance).id))
            gi_id = int(api.nvmlGpuInstanceGetInfo(instance).id)
            found = self._mig_device(handle, gpu_index, gi_id)
            if found is not None:
                return found
            ci_profile = COMPUTE_INSTANCE_PROFILES.get(shape.compute_slices)
            if ci_profile is None:
                raise MigWriteError(f"{where}: no compute instance profile spans "
                                    f"{shape.compute_slices} compute slices")
            info = api.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                instance, ci_profile, pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            api.nvmlGpuInstanceCreateComputeInstance(instance, info.id)
            found = self._mig_device(handle, gpu_index, gi_id)
        except pynvml.NVMLError as exc:
            raise MigWriteError(f"{where}: {exc}") from None
        if found is None:
            raise MigWriteError(f"{where}: created, but NVML lists no MIG device for GPU "
                                f"instance {gi_id}")
        return found

    def destroy(self, gpu_index: int, gpu_instance_id: int,
                compute_instance_id: int) -> bool:
        """Destroy the compute instance and then the GPU instance; False when the GPU
        instance was gone already. :class:`MigWriteError` when NVML refuses (a process still
        runs on it: the kubelet retries the unprepare)."""
        api = self._api
        where = f"GPU {gpu_index}: GPU instance {gpu_instance_id}"
        try:
            handle = api.nvmlDeviceGetHandleByIndex(gpu_index)
            try:
                instance = api.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
            except pynvml.NVMLError_NotFound:
                return False
            try:
                compute = api.nvmlGpuInstanceGetComputeInstanceById(instance,
                                                                    compute_instance_id)
            except pynvml.NVMLError_NotFound:
                pass  # destroyed by an earlier try that stopped before the GPU instance
            else:
                api.nvmlComputeInstanceDestroy(compute)
            api.nvmlGpuInstanceDestroy(instance)
        except pynvml.NVMLError as exc:
            raise MigWriteError(f"{where}: destroying it failed: {exc}") from None
        return True

    # -- lookups -------------------------------------------------------------------------------

    def _profile(self, handle: object, shape: MigShape, where: str) -> _Profile:
        """The GPU instance profile of ``shape`` on this GPU (module docstring)."""
        found: list[_Profile] = []
        for profile in GPU_INSTANCE_PROFILES:
            try:
                info = self._api.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
            except pynvml.NVMLError_NotSupported:
                continue  # this GPU has no such profile
            if int(info.sliceCount) == shape.compute_slices:
                found.append(_Profile(int(info.id), int(info.memorySizeMB)))
        if not found:
            raise MigWriteError(f"{where}: this GPU has no GPU instance profile of "
                                f"{shape.compute_slices} compute slices")
        return min(found, key=lambda p: (abs(p.memory_mib - shape.memory_mib), p.id))

    def _recorded(self, handle: object, gpu_instance_id: int | None, profile_id: int,
                  shape: MigShape) -> object | None:
        """The GPU instance an earlier try recorded, if it is still there as ``shape``."""
        if gpu_instance_id is None:
            return None
        try:
            instance = self._api.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        except pynvml.NVMLError_NotFound:
            return None
        info = self._api.nvmlGpuInstanceGetInfo(instance)
        if (int(info.profileId), int(info.placement.start)) != (profile_id, shape.start):
            return None  # the id was reused for another instance
        return instance

    def _found_at(self, handle: object, profile_id: int, shape: MigShape) -> object | None:
        """A GPU instance of ``profile_id`` at ``shape``'s start that has a MIG device."""
        api = self._api
        for device in self._mig_handles(handle):
            instance = api.nvmlDeviceGetGpuInstanceById(
                handle, int(api.nvmlDeviceGetGpuInstanceId(device)))
            info = api.nvmlGpuInstanceGetInfo(instance)
            if (int(info.profileId), int(info.placement.start)) == (profile_id, shape.start):
                return instance
        return None

    def _mig_handles(self, handle: object) -> Iterator[object]:
        """The MIG devices of a GPU (one per compute instance), empty slots skipped."""
        for slot in range(self._api.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                yield self._api.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue

    def _mig_device(self, handle: object, gpu_index: int, gi_id: int) -> MigDevice | None:
        """The MIG device (a compute instance) of GPU instance ``gi_id``, if it has one."""
        api = self._api
        for device in self._mig_handles(handle):
            if int(api.nvmlDeviceGetGpuInstanceId(device)) == gi_id:
                return MigDevice(gpu_index, gi_id,
                                 int(api.nvmlDeviceGetComputeInstanceId(device)),
                                 nvml_text(api.nvmlDeviceGetUUID(device)))
        return None


@dataclass(frozen=True, slots=True)
class _Profile:
    id: int
    memory_mib: int
