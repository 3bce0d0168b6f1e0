"""kube-default: kube-scheduler's own node scores, for "what does a cluster without gpufrag do".

kube-scheduler's default profile scores a node with two plugins that look at resources, each
0..100 and weight 1, summed; the rest of its score plugins (taints, affinities, topology
spread, image locality) give every node of a plain trace pod the same score:

- NodeResourcesFit, strategy LeastAllocated over ``cpu`` and ``memory`` (its default
  resources): per resource ``(allocatable − requested) · 100 / allocatable`` in integer
  arithmetic (0 when over), ``requested`` = what the node's pods ask + this pod, a pod asking
  none counted as 100 milli-CPU / 200 MiB; the two averaged, integer.
- NodeResourcesBalancedAllocation over ``cpu`` and ``memory``: ``(1 − std) · 100`` truncated,
  std of the two requested fractions (capped at 1) after placing the pod; 0 for a pod asking
  no CPU and no memory.

GPUs are not among the default scoring resources, with the device plugin or with DRA (Dynamic
Resource Allocation has no device scoring, KEP-4970 is open; DRA-backed extended resources are
scored only when named in the scoring strategy), so this is the node choice a DRA cluster gets
when nothing else scores. What is not modelled: the nodes' own requested figures count a pod
that asks none as nothing rather than 100 m / 200 MiB (the trace does not say which running
pods those are), ties go to the seed's fixed node order (kube-scheduler draws among the top
nodes at random), and every feasible node is scored (kube-scheduler stops after
``percentageOfNodesToScore``, about 41% of a 1,213-node cluster). A share's GPU, where the
policy picks it, is the tightest that fits, as for the paper's baselines.
"""

from __future__ import annotations

import numpy as np

from scheduler.core.gpus import tightest_gpu
from scheduler.core.policy import Scores
from scheduler.core.state import ClusterState, IntArray
from scheduler.core.types import PodRequest

MAX_NODE_SCORE = 100
# kube-scheduler's non-zero defaults for a pod that asks no CPU / memory (scoring only).
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY_MIB = 200


def _least_allocated(capacity: IntArray, requested: IntArray) -> IntArray:
    """One resource's LeastAllocated score per row, integer as kube-scheduler computes it."""
    safe = np.maximum(capacity, 1)
    score = (capacity - requested) * MAX_NODE_SCORE // safe
    out: IntArray = np.where((capacity > 0) & (requested <= capacity), score, 0)
    return out


class KubeDefaultPolicy:
    name = "kube-default"
    node_local = True

    def score(self, state: ClusterState, pod: PodRequest, rows: IntArray) -> Scores:
        cpu_cap, mem_cap = state.cpu_cap[rows], state.mem_cap[rows]
        cpu_used = cpu_cap - state.cpu_left[rows]
        mem_used = mem_cap - state.mem_left[rows]
        cpu_req = pod.cpu_milli or DEFAULT_CPU_MILLI
        mem_req = pod.memory_mib or DEFAULT_MEMORY_MIB
        fit = (_least_allocated(cpu_cap, cpu_used + cpu_req)
               + _least_allocated(mem_cap, mem_used + mem_req)) // 2
        if pod.cpu_milli or pod.memory_mib:
            cpu_frac = np.minimum((cpu_used + pod.cpu_milli) / np.maximum(cpu_cap, 1), 1.0)
            mem_frac = np.minimum((mem_used + pod.memory_mib) / np.maximum(mem_cap, 1), 1.0)
            std = np.abs(cpu_frac - mem_frac) / 2.0
            balanced = np.trunc((1.0 - std) * MAX_NODE_SCORE)
        else:
            balanced = np.zeros(rows.size)
        return Scores((fit + balanced).astype(np.float64),
                      tightest_gpu(state.gpu_free[rows], pod.gpu_milli))
