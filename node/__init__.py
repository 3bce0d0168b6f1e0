"""What runs on a GPU node, one DaemonSet each: the agent and the kubelet device plugin.

:mod:`node.agent` (``gpufrag agent``) reads the GPUs through NVML, maps their processes to pods
and publishes per-pod GPU usage on the Node; :mod:`node.deviceplugin` (``gpufrag device-plugin``)
advertises the GPUs to the kubelet and hands each container exactly the GPUs the extender chose.
The two do not import each other (``lint-imports`` checks it); the start-up they share,
from flags to signals, is :mod:`node.daemon`, in a layer below both.
"""
