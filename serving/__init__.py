"""serving — the in-pod batching runtime behind ``gpufrag serve``.

A KServe/Triton v2 HTTP server (routes :mod:`serving.app`, HTTP/1.1 front end
:mod:`serving.frontend`, process lifecycle :mod:`serving.server`) feeding a dynamic
batcher (:mod:`serving.batcher`) that runs one model through a backend
(:mod:`serving.backends`: ONNX Runtime, TensorRT), with Prometheus metrics
(:mod:`serving.metrics`), a GPU probe (:mod:`serving.gpu`), built-in ResNet models
(:mod:`serving.models`) and a retrying client (:mod:`serving.client`).

Independent of the scheduler: nothing here imports ``scheduler``, ``defrag`` or ``simulations``
(an import-linter contract).
"""
