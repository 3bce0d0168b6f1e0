"""Model backends behind one small Protocol (:class:`serving.backends.base.Backend`).

- :mod:`serving.backends.onnx_runtime` — ONNX Runtime; CUDA execution provider when present.
- :mod:`serving.backends.tensorrt_engine` — TensorRT FP16 engines built from ONNX, cached on
  disk; only when ``tensorrt`` is importable and a GPU is present.
- :mod:`serving.backends.select` — picks one for ``--backend auto|onnxruntime|tensorrt``.
"""

from serving.backends.base import Array, Backend

__all__ = ["Array", "Backend"]
