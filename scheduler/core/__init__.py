"""The placement core: pure numpy + stdlib.

``ClusterState`` holds what the cluster looks like; ``feasibility`` says whether (and why not) a
pod fits a node; ``fragmentation`` measures FGD's fragmentation; ``placement`` turns a policy's
scores into one decision. The extender, the defrag planner and the simulator all call these.
"""

from scheduler.core.feasibility import Verdict, explain, feasible_mask
from scheduler.core.fragmentation import (
    TargetWorkload,
    cluster_fragmentation,
    fragmentation_ratio,
    node_fragmentation,
)
from scheduler.core.placement import Decision, ScoreCache, choose
from scheduler.core.state import ClusterState
from scheduler.core.types import MILLI_PER_GPU, NodeSpec, Placement, PodRequest

__all__ = [
    "MILLI_PER_GPU",
    "ClusterState",
    "Decision",
    "NodeSpec",
    "Placement",
    "PodRequest",
    "ScoreCache",
    "TargetWorkload",
    "Verdict",
    "choose",
    "cluster_fragmentation",
    "explain",
    "feasible_mask",
    "fragmentation_ratio",
    "node_fragmentation",
]
