"""``gpufrag dra-plugin``: the Dynamic Resource Allocation (DRA) driver, beside the device plugin.

It publishes this node's GPUs as one ResourceSlice (:mod:`node.dra.slices`) and serves the
kubelet's DRA plugin service (:mod:`node.dra.service`), which turns a claim that kube-scheduler
allocated into a CDI device with the same environment the device plugin sets
(:mod:`node.gpus`). It never writes an allocation: kube-scheduler does (docs/dra.md).
"""
