"""The kubelet device plugin (``gpufrag device-plugin``): the node side of GPU placement.

The extender chooses GPUs for a pod and records their indices on it at bind
(``gpufrag.io/gpu-indices``); this plugin makes that choice real on the node. It advertises the
node's GPUs to the kubelet over the device-plugin API v1beta1 (gRPC on a unix socket) as two
resources — whole GPUs (``nvidia.com/gpu``, one device per GPU UUID) and shares
(``gpufrag.io/gpu-milli``, 1000 devices per GPU) — reports their health from NVML, and answers
each Allocate with exactly the GPUs recorded for the pod the call is for.

Modules: ``api`` (generated messages + typed gRPC glue), ``config``, ``inventory`` (GPUs and
health), ``devices`` (device IDs), ``matching`` (which pod a call is for: pure), ``allocator``
(the decisions behind the RPCs), ``service`` (the gRPC service), ``server`` (sockets,
registration, kubelet restarts), ``pods`` (the node's pod cache: the one read), ``writes``
(every write), ``metrics``, ``cli``. See docs/deviceplugin.md.
"""
