"""The one interface every model backend implements (:class:`Backend`, checked by mypy), and
the one base the real backends share (:class:`BaseBackend`): what a backend is, takes and gives
and its batch bounds are fixed once it has loaded, so they are stored and answered here, and a
backend module holds only its own part (loading its runtime, :meth:`Backend.infer`,
:meth:`Backend.close`).

A backend is synchronous: the batcher calls :meth:`Backend.infer` from a worker thread, one
batch at a time per thread, with arrays whose first dimension is the batch. Backends that
release the GIL while computing (ONNX Runtime, TensorRT) leave the event loop responsive.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from serving.tensors import TensorSpec

Array = npt.NDArray[Any]


class Backend(Protocol):
    @property
    def kind(self) -> str:
        """What runs the model: ``onnxruntime-cpu``, ``onnxruntime-cuda``, ``tensorrt-fp16``."""
        ...

    @property
    def inputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def outputs(self) -> tuple[TensorSpec, ...]: ...

    @property
    def static_batch_size(self) -> int | None:
        """The graph's fixed batch dimension, if it has one: batches are zero-padded up to it."""
        ...

    @property
    def max_batch_size(self) -> int | None:
        """The largest batch the backend accepts (a TensorRT profile's max), None = unbounded."""
        ...

    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Compute one batch; every output's first dimension equals the inputs' batch size."""
        ...

    def close(self) -> None: ...


class BaseBackend(ABC):
    """A backend's description, given once at the end of its loading (``kind``, the tensors,
    the batch bounds; see :class:`Backend`), answered by read-only properties. Subclasses
    implement :meth:`infer` and :meth:`close`."""

    def __init__(self, *, kind: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                 static_batch_size: int | None = None,
                 max_batch_size: int | None = None) -> None:
        self._kind = kind
        self._inputs = tuple(inputs)
        self._outputs = tuple(outputs)
        self._static_batch_size = static_batch_size
        self._max_batch_size = max_batch_size

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self._outputs

    @property
    def static_batch_size(self) -> int | None:
        return self._static_batch_size

    @property
    def max_batch_size(self) -> int | None:
        return self._max_batch_size

    @abstractmethod
    def infer(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Compute one batch (:meth:`Backend.infer`)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the backend holds (a session, device memory)."""


def _conforms(backend: BaseBackend) -> Backend:
    return backend  # mypy: every BaseBackend implements the Backend Protocol


def zeros_like_spec(spec: TensorSpec, batch: int) -> Array:
    """A zero batch for ``spec`` (warm-up, padding); -1 dims other than the batch become 1."""
    dims = [batch] + [d if d > 0 else 1 for d in spec.shape[1:]]
    return np.zeros(dims, dtype=spec.dtype)
