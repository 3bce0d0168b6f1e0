"""GPU placement: the pure placement core, the policies, the Kubernetes adapters, the extender.

:mod:`scheduler.core` (ClusterState, feasibility, fragmentation), :mod:`scheduler.policies` (FGD
and the baselines), :mod:`scheduler.kube` (Kubernetes objects -> core types, watch, cache, binds)
and :mod:`scheduler.extender` (the kube-scheduler extender serving filter, prioritize and bind).
"""
