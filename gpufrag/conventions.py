"""Names shared across components: resource names, label keys and annotation keys.

These are the defaults; every component takes them from its configuration so that existing
names (HAMi's, Aliyun's) can be mapped. They live here, in one place, because the extender
writes what the defrag controller and the node agent read.
"""

from __future__ import annotations

# Whole GPUs (NVIDIA device plugin).
RESOURCE_GPU = "nvidia.com/gpu"
# Shared GPUs: per-GPU share in milli-GPU (as the openb trace) and GPU memory in MiB.
RESOURCE_GPU_MILLI = "gpufrag.io/gpu-milli"
RESOURCE_GPU_MEMORY_MIB = "gpufrag.io/gpu-memory-mib"

# GPU feature discovery labels on nodes.
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY_MIB = "nvidia.com/gpu.memory"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"

# Model identity on pods.
LABEL_MODEL = "gpufrag.io/model"
LABEL_MODEL_VERSION = "gpufrag.io/model-version"

# Acceptable GPU products for a pod, "|"-separated like openb's gpu_spec.
ANNOTATION_GPU_SPEC = "gpufrag.io/gpu-spec"
# GPUs chosen at bind: comma-separated GPU indices on the node, e.g. "0,3".
ANNOTATION_GPU_INDICES = "gpufrag.io/gpu-indices"
# Per-GPU usage published by the node agent on its Node (JSON, see defrag.agent).
ANNOTATION_GPU_USAGE = "gpufrag.io/gpu-usage"
# Placement hint written by the defrag controller on a workload: the node a replacement pod
# should land on, with an expiry (JSON {"node": ..., "expires": <unix seconds>}).
ANNOTATION_PLACEMENT_HINT = "gpufrag.io/placement-hint"
# Opt a pod out of defragmentation moves ("false").
ANNOTATION_DEFRAG_MOVABLE = "gpufrag.io/defrag-movable"

SCHEDULER_NAME = "gpufrag-scheduler"

# Placement hints from the defrag controller to the extender: one ConfigMap whose data maps an
# owner's UID (the ReplicaSet/StatefulSet/Job of an evicted pod) to a JSON list of
# {"node": <target node>, "expires": <unix seconds>}. The extender scores a pod's hinted nodes
# highest until the hint expires; the controller removes a hint once the replacement is bound.
HINTS_CONFIGMAP = "gpufrag-placement-hints"
HINTS_NAMESPACE = "gpufrag-system"
