"""Tensor descriptions shared by the backends and the v2 protocol layer.

The v2 inference protocol names datatypes ``FP32``, ``INT64``...; ONNX Runtime names them
``tensor(float)``...; numpy has its own dtypes. This module is the one place that maps them.
Shapes use -1 for a dimension that varies per request (always the batch dimension, dim 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# v2 datatype -> numpy dtype. BYTES (strings) is not supported by the image models served here.
V2_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
NUMPY_TO_V2: dict[np.dtype[np.generic], str] = {v: k for k, v in V2_TO_NUMPY.items()}

ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: name, v2 datatype, shape with -1 for the batch dimension.

    ``allow_non_finite`` is the request rule for a floating-point *input*: False (the default)
    makes the v2 protocol layer reject NaN and +-Inf, whether the tensor came as JSON or as
    binary data, because a model fed NaN answers NaN with a 200 and nobody notices. Set it for
    inputs where NaN means something (a missing-value marker). It is not published in the v2
    metadata (the protocol has no such field) and backends ignore it.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    allow_non_finite: bool = False

    @property
    def dtype(self) -> np.dtype[np.generic]:
        return V2_TO_NUMPY[self.datatype]

    def metadata(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}
