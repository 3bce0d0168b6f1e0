"""The one interface every model backend implements, checked by mypy (see ``_conforms`` in
each backend module).

A backend is synchronous: the batcher calls :meth:`Backend.infer` from a worker thread, one
batch at a time per thread, with arrays whose first dimension is the batch. Backends that
release the GIL while computing (ONNX Runtime, TensorRT) leave the event loop responsive.
"""

from __future__ import annotations

from collections.abc import Mapping
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


def zeros_like_spec(spec: TensorSpec, batch: int) -> Array:
    """A zero batch for ``spec`` (warm-up, padding); -1 dims other than the batch become 1."""
    dims = [batch] + [d if d > 0 else 1 for d in spec.shape[1:]]
    return np.zeros(dims, dtype=spec.dtype)
