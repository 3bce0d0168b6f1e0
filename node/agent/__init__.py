"""The GPU node agent (``gpufrag agent``, a DaemonSet): NVML -> per-pod GPU usage -> the Node.

Modules, in data-flow order:

- :mod:`gpufrag.nvml` (the shared NVML adapter, not in this package) reads GPUs and their
  processes through pynvml;
- :mod:`node.agent.cgroup` maps a process to its pod (``/proc/<pid>/cgroup`` + the API);
- :mod:`gpufrag.gpu_usage` (the shared base, not in this package) is the schema of the
  ``gpufrag.io/gpu-usage`` Node annotation the agent publishes, the public contract with its
  readers (the extender, the defrag controller);
- :mod:`node.agent.leakwatch` spots pods whose GPU memory keeps growing;
- :mod:`node.agent.publish` holds every write to the cluster and the rule for when to write;
- :mod:`node.agent.metrics` exports ``/metrics``, ``/healthz``, ``/readyz``;
- :mod:`node.agent.loop` runs one interval after another; :mod:`node.agent.cli` wires it up.

Nothing is imported here.
"""
