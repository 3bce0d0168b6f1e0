"""The development kit: what people need from a checkout, never the product image.

The local control plane (Go build, PKI, processes, the kubelet stand-in), the gpufrag-scheduler
stack the end-to-end tests and benchmarks share, the ``gpufrag dev-cluster`` and ``gpufrag demo``
commands, and the zero-cost reference extender for benchmarks. It imports the product; the
product never imports it (``lint-imports`` checks it).
"""
