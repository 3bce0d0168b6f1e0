"""Serving's view of the GPUs: utilisation and memory per GPU, read through :mod:`gpufrag.nvml`.

NVML itself is read by the shared adapter (:class:`gpufrag.nvml.NvmlReader`), the same one the
node agent uses; this module adds only what serving wants on top. Where there is no GPU — no
driver, no NVML library, no devices — :func:`detect_gpus` says so in one log line and returns
``None``; callers then leave the GPU metrics out instead of publishing zeros. A GPU whose read
fails later (lost, driver reset) is skipped and said once, so neither a scrape nor a batch fails
because a GPU went away. Tests drive the probe with recorded readings
(:class:`gpufrag.nvml_recorded.RecordedNvml`), since CI has no GPU.

:class:`MemoryGrowthWatch` wraps a backend and warns when a GPU's used memory grew by more than
a threshold (default 100 MiB) across one batch — the signature of a leak or of an allocator
growing its pool for a new, larger shape — and tells its :class:`GrowthObserver` (the runtime's
metrics count it: ``gpufrag_serving_gpu_memory_growth_batches_total``, which the
``GpufragServingGpuMemoryGrowth`` alert watches). It uses the memory-only read (one NVML call
per GPU, no process listing), cheap enough for every batch. NVML reports device-wide memory, so
on a shared GPU another process's allocation can trip it too; the warning says which GPU and by
how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import structlog

from gpufrag.nvml import MIB, GpuReadError, GpuReading, NvmlApi, NvmlReader, detect
from serving.backends.base import Array, Backend
from serving.tensors import TensorSpec

log = structlog.get_logger("serving.gpu")

class GpuProbe(Protocol):
    def read(self) -> Sequence[GpuReading]: ...


class GrowthObserver(Protocol):
    """Told of each batch after which a GPU's used memory had grown beyond the threshold
    (:class:`serving.metrics.ServingMetrics` counts them)."""

    def gpu_memory_grew(self, gpu: int, grown_bytes: int) -> None: ...


class NvmlProbe:
    """Every GPU an opened :class:`~gpufrag.nvml.NvmlReader` sees, read leniently: a GPU whose
    read fails is left out of that reading, and the first such failure is logged once.

    Owns the reader: :meth:`close` shuts NVML down.
    """

    def __init__(self, reader: NvmlReader) -> None:
        self._reader = reader
        gpus = reader.inventory()  # names for the engine cache and the start-up log, read once
        self.names = [gpu.product for gpu in gpus]
        self.uuids = [gpu.uuid for gpu in gpus]
        self._read_failed = False

    @property
    def count(self) -> int:
        return self._reader.device_count

    def read(self) -> list[GpuReading]:
        """Utilisation and memory of every readable GPU, without process lists (serving's
        gauges need none, and listing processes is the slowest NVML call)."""
        readings: list[GpuReading] = []
        for index in range(self.count):
            try:
                readings.append(self._reader.read_gpu(index, processes=False))
            except GpuReadError as exc:
                self._failed(index, exc)
        return readings

    def memory_used_bytes(self) -> dict[int, int]:
        """GPU index -> used bytes, one NVML call per GPU: the per-batch read."""
        used: dict[int, int] = {}
        for index in range(self.count):
            try:
                used[index] = self._reader.read_memory(index).memory_used_bytes
            except GpuReadError as exc:
                self._failed(index, exc)
        return used

    def _failed(self, index: int, exc: GpuReadError) -> None:
        if not self._read_failed:  # a lost GPU fails every read; one line says it
            log.warning("gpu_read_failed", gpu=index, error=str(exc))
            self._read_failed = True

    def close(self) -> None:
        self._reader.close()  # never raises: a probe's shutdown must not fail the exit


def detect_gpus(nvml: NvmlApi | None = None) -> NvmlProbe | None:
    """An :class:`NvmlProbe` when a GPU is usable, else ``None`` after one clear log line.
    ``nvml`` replaces the real binding (tests pass a recorded one)."""
    reader = detect(nvml, log=log, effect="no GPU metrics, CPU backends only")
    if reader is None:
        return None
    try:
        return NvmlProbe(reader)
    except GpuReadError as exc:  # lost between detection and now; the same one line
        reader.close()
        log.warning("nvml_failed", error=str(exc), effect="no GPU metrics, CPU backends only")
        return None


class MemoryGrowthWatch:
    """A :class:`Backend` wrapper warning when GPU memory grows > threshold over one batch."""

    def __init__(self, backend: Backend, probe: NvmlProbe, *, threshold_mib: float = 100.0,
                 observer: GrowthObserver | None = None) -> None:
        self._backend = backend
        self._probe = probe
        self._threshold_bytes = threshold_mib * MIB
        self._observer = observer
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
                if self._observer is not None:
                    self._observer.gpu_memory_grew(gpu, grown)
        return outputs

    def close(self) -> None:
        self._backend.close()


def _conforms(watch: MemoryGrowthWatch) -> Backend:
    return watch  # mypy: the wrapper is itself a Backend
