"""GPU probe: utilisation and memory per GPU through NVML (pynvml, from nvidia-ml-py).

Where there is no GPU — no driver, no NVML library, no devices, or pynvml missing — the probe
says so in one log line and :func:`detect_gpus` returns ``None``; callers then leave the GPU
metrics out instead of publishing zeros. Tests drive :class:`NvmlProbe` with recorded readings
through an NVML stand-in (:class:`serving.testing.RecordedNvml`), since CI has no GPU.

:class:`MemoryGrowthWatch` wraps a backend and warns when a GPU's used memory grew by more than
a threshold (default 100 MiB) across one batch — the signature of a leak or of an allocator
growing its pool for a new, larger shape. NVML reports device-wide memory, so on a shared GPU
another process's allocation can trip it too; the warning says which GPU and by how much.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from serving.backends.base import Array, Backend
from serving.tensors import TensorSpec

log = structlog.get_logger("serving.gpu")

MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    utilization_ratio: float
    memory_used_bytes: int
    memory_total_bytes: int


class GpuProbe(Protocol):
    def read(self) -> list[GpuReading]: ...


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """Reads every GPU NVML can see. ``nvml`` is the pynvml module (or a recorded stand-in)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
        self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._read_failed = False

    @property
    def count(self) -> int:
        return len(self._handles)

    def read(self) -> list[GpuReading]:
        readings: list[GpuReading] = []
        for index, handle in enumerate(self._handles):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            except Exception as exc:  # NVMLError (GPU lost, driver reset): skip, say once
                if not self._read_failed:
                    log.warning("gpu_read_failed", gpu=index, error=str(exc))
                    self._read_failed = True
                continue
            readings.append(GpuReading(
                index=index, uuid=self.uuids[index], name=self.names[index],
                utilization_ratio=float(util.gpu) / 100.0,
                memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total)))
        return readings

    def memory_used_bytes(self) -> dict[int, int]:
        return {r.index: r.memory_used_bytes for r in self.read()}

    def close(self) -> None:
        with contextlib.suppress(Exception):  # a probe's shutdown must never fail the exit
            self._nvml.nvmlShutdown()


def detect_gpus(nvml: Any | None = None) -> NvmlProbe | None:
    """An :class:`NvmlProbe` when a GPU is usable, else ``None`` after one clear log line."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            log.info("no_gpu", reason="pynvml (nvidia-ml-py) is not installed; GPU metrics off")
            return None
    try:
        probe = NvmlProbe(nvml)
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        log.info("no_gpu", reason=f"NVML unavailable ({type(exc).__name__}: {exc}); "
                 "no GPU metrics, CPU backends only")
        return None
    if probe.count == 0:
        log.info("no_gpu", reason="NVML found no GPU devices; GPU metrics off")
        probe.close()
        return None
    log.info("gpus_found", count=probe.count, names=probe.names)
    return probe


class MemoryGrowthWatch:
    """A :class:`Backend` wrapper warning when GPU memory grows > threshold over one batch."""

    def __init__(self, backend: Backend, probe: NvmlProbe, *,
                 threshold_mib: float = 100.0) -> None:
        self._backend = backend
        self._probe = probe
        self._threshold_bytes = threshold_mib * MIB
        self.warnings = 0

    @property
    def kind(self) -> str:
        return self._backend.kind

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._backend.inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._backend.outputs

    @property
    def static_batch_size(self) -> int | None:
        return self._backend.static_batch_size

    @property
    def max_batch_size(self) -> int | None:
        return self._backend.max_batch_size

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        before = self._probe.memory_used_bytes()
        outputs = self._backend.infer(inputs)
        after = self._probe.memory_used_bytes()
        rows = next(iter(inputs.values())).shape[0] if inputs else 0
        for gpu, used in after.items():
            grown = used - before.get(gpu, used)
            if grown > self._threshold_bytes:
                self.warnings += 1
                log.warning("gpu_memory_growth", gpu=gpu, grew_mib=round(grown / MIB, 1),
                            threshold_mib=self._threshold_bytes / MIB, batch_rows=rows,
                            used_mib=round(used / MIB, 1))
        return outputs

    def close(self) -> None:
        self._backend.close()


def _conforms(watch: MemoryGrowthWatch) -> Backend:
    return watch  # mypy: the wrapper is itself a Backend
