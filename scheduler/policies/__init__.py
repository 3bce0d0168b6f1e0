"""Placement policies: one module each, one line each in ``POLICY_NAMES`` / ``make_policy``.

The five baselines of the FGD paper and FGD itself, scored as the FGD authors' simulator scores
them, except two refinements that are the default (exact BestFit scores; FGD's share on the GPU
with the smallest exact fragmentation change) and that ``kss_compat`` turns back into the
reference's rules (see each module). Model-version affinity (``affinity``) is a blend the
extender adds on top of any of them. ``kube-default`` (kube-scheduler's own resource scores)
is a baseline for the what-if only, outside the paper's six that ``POLICY_NAMES`` lists and
that the what-if runs by default.
"""

from __future__ import annotations

from scheduler.core.fragmentation import TargetWorkload
from scheduler.core.gpus import POLICY_CHOICE, DeviceChoice
from scheduler.core.policy import Policy
from scheduler.policies.bestfit import BestFitPolicy
from scheduler.policies.clustering import GpuClusteringPolicy
from scheduler.policies.dotprod import DotProductPolicy
from scheduler.policies.fgd import FgdPolicy
from scheduler.policies.kube_default import KubeDefaultPolicy
from scheduler.policies.packing import GpuPackingPolicy
from scheduler.policies.random_feasible import RandomPolicy

POLICY_NAMES = ("random", "dotprod", "gpu-clustering", "gpu-packing", "bestfit", "fgd")
# Baselines outside the paper's six: named explicitly, never part of a default run.
BASELINE_NAMES = ("kube-default",)
ALL_POLICY_NAMES = POLICY_NAMES + BASELINE_NAMES


def make_policy(name: str, *, workload: TargetWorkload | None = None, seed: int = 0,
                kss_compat: bool = False, device_choice: DeviceChoice = POLICY_CHOICE) -> Policy:
    """Build a policy by name; ``fgd`` needs the target workload, ``random`` uses the seed.
    ``kss_compat`` selects the FGD authors' simulator's exact rules where gpufrag's default
    differs from them (FGD's share-GPU choice and rounding, BestFit's truncation).
    ``device_choice`` is the GPU FGD scores a share on (its own pick, or DRA's first fit); only
    FGD weighs a node by the GPU it will take there, so the others ignore it."""
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
        return FgdPolicy(workload, kss_compat=kss_compat, device_choice=device_choice)
    if name == "kube-default":
        return KubeDefaultPolicy()
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(ALL_POLICY_NAMES)}")


__all__ = ["ALL_POLICY_NAMES", "BASELINE_NAMES", "POLICY_NAMES", "make_policy"]
