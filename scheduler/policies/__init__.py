"""Placement policies: one module each, one line each in ``POLICY_NAMES`` / ``make_policy``.

The five baselines of the FGD paper and FGD itself, scored exactly as the FGD authors' simulator
scores them (see each module). Model-version affinity (``affinity``) is a blend the extender adds
on top of any of them.
"""

from __future__ import annotations

from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.policy import Policy
from scheduler.policies.bestfit import BestFitPolicy
from scheduler.policies.clustering import GpuClusteringPolicy
from scheduler.policies.dotprod import DotProductPolicy
from scheduler.policies.fgd import FgdPolicy
from scheduler.policies.packing import GpuPackingPolicy
from scheduler.policies.random_feasible import RandomPolicy

POLICY_NAMES = ("random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd")


def make_policy(name: str, *, workload: TargetWorkload | None = None, seed: int = 0) -> Policy:
    """Build a policy by name; ``fgd`` needs the target workload, ``random`` uses the seed."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "dotprod":
        return DotProductPolicy()
    if name == "gpu-clustering":
        return GpuClusteringPolicy()
    if name == "gpu-packing":
        return GpuPackingPolicy()
    if name == "bestfit":
        return BestFitPolicy()
    if name == "fgd":
        if workload is None:
            raise ValueError("policy fgd needs a target workload")
        return FgdPolicy(workload)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "make_policy"]
