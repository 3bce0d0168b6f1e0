"""Placement policies: one module each, one line each in ``POLICY_NAMES`` / ``make_policy``.

The five baselines of the FGD paper and FGD itself, scored as the FGD authors' simulator scores
them, except two refinements that are the default (exact BestFit scores; FGD's share on the GPU
with the smallest exact fragmentation change) and that ``kss_compat`` turns back into the
reference's rules (see each module). Model-version affinity (``affinity``) is a blend the
extender adds on top of any of them.
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


def make_policy(name: str, *, workload: TargetWorkload | None = None, seed: int = 0,
                kss_compat: bool = False) -> Policy:
    """Build a policy by name; ``fgd`` needs the target workload, ``random`` uses the seed.
    ``kss_compat`` selects the FGD authors' simulator's exact rules where gpufrag's default
    differs from them (FGD's share-GPU choice and rounding, BestFit's truncation)."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "dotprod":
        return DotProductPolicy()
    if name == "gpu-clustering":
        return GpuClusteringPolicy()
    if name == "gpu-packing":
        return GpuPackingPolicy()
    if name == "bestfit":
        return BestFitPolicy(integer=kss_compat)
    if name == "fgd":
        if workload is None:
            raise ValueError("policy fgd needs a target workload")
        return FgdPolicy(workload, kss_compat=kss_compat)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


__all__ = ["POLICY_NAMES", "make_policy"]
