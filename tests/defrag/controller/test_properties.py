"""Properties of every plan, over generated clusters, pods, PDBs and budgets."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from defrag.controller.config import DefragConfig, Limits
from defrag.controller.model import LabelSelector, Pdb, PodInfo, Snapshot, snapshot_of_state
from defrag.controller.planner import movability, plan
from scheduler.core import ClusterState, NodeSpec, PodRequest, TargetWorkload
from scheduler.core.feasibility import feasible_mask
from scheduler.policies import make_policy
from tests.defrag.controller.builders import positions

NAMESPACES = ("a", "b")
APPS = ("x", "y")
OWNERS = ("ReplicaSet", "ReplicaSet", "StatefulSet", "Job", "DaemonSet", "")


@dataclass
class Case:
    nodes: list[NodeSpec]
    snapshot: Snapshot
    limits: Limits
    policy: str


@st.composite
def cases(draw: st.DrawFn) -> Case:
    nodes = [NodeSpec(name=f"n{i}", cpu_milli=draw(st.integers(4_000, 32_000)),
                      memory_mib=65_536, gpu_count=draw(st.integers(1, 4)),
                      gpu_product=draw(st.sampled_from(["T4", "V100M32"])),
                      gpu_memory_mib=draw(st.sampled_from([16_384, 32_768])))
             for i in range(draw(st.integers(2, 6)))]
    state = ClusterState(nodes)
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    infos: dict[str, PodInfo] = {}
    used: dict[str, float] = {}
    pending: list[PodRequest] = []
    for i in range(draw(st.integers(1, 24))):
        whole = draw(st.integers(0, 4)) == 0
        ns = draw(st.sampled_from(NAMESPACES))
        pod = PodRequest(name=f"p{i}", namespace=ns, cpu_milli=draw(st.integers(0, 4_000)),
                         memory_mib=512, num_gpu=draw(st.integers(1, 2)) if whole else 1,
                         gpu_milli=1000 if whole else draw(st.integers(50, 950)))
        rows = state.active_rows()
        fits = rows[feasible_mask(state, pod, rows)]
        if fits.size == 0:
            pending.append(pod)
            continue
        row = int(rng.choice(fits))
        free = state.gpu_free[row, : state.gpu_count[row]]
        if pod.is_share:
            gpus: tuple[int, ...] = (int(rng.choice(np.flatnonzero(free >= pod.gpu_milli))),)
        else:
            gpus = tuple(int(g) for g in np.flatnonzero(free == 1000)[: pod.num_gpu])
        placement = state.place(pod, row, gpus)
        key = f"{ns}/p{i}"
        used[key] = draw(st.floats(0.0, 1.0)) * pod.gpu_milli / 1000 * float(
            state.gpu_memory_mib[row])
        infos[key] = PodInfo(key=key, request=pod, uid=key, node=placement.node,
                             owner_kind=draw(st.sampled_from(OWNERS)), owner_uid=f"o-{key}",
                             labels={"app": draw(st.sampled_from(APPS))},
                             priority=draw(st.sampled_from([0, 0, 10**9 + 1])))
    pdbs = [Pdb(ns, f"pdb-{ns}-{app}", LabelSelector({"app": app}),
                draw(st.integers(0, 2)))
            for ns in NAMESPACES for app in APPS if draw(st.booleans())]
    if draw(st.booleans()):
        pdbs.append(Pdb("a", "everything", LabelSelector(), draw(st.integers(0, 3))))
    snap = snapshot_of_state(state, used, pending=pending, pdbs=pdbs, infos=infos)
    limits = Limits(per_node=draw(st.integers(0, 3)), per_namespace=draw(st.integers(0, 3)),
                    total=draw(st.integers(0, 6)))
    return Case(nodes, snap, limits, draw(st.sampled_from(["fgd", "bestfit", "gpu-packing"])))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.floats(0.0, 0.9))
def test_plans_respect_capacity_limits_and_budgets(case: Case, threshold: float) -> None:
    snap = case.snapshot
    requests = [p.pod for p in snap.state.pods.values()] + [p.request for p in snap.pending]
    workload = TargetWorkload.from_pods(requests)
    config = DefragConfig(threshold=threshold, limits=case.limits, policy=case.policy)
    before = positions(snap)
    used_before = snap.usage.used_mib.copy()
    result = plan(snap, make_policy(case.policy, workload=workload), workload, config)

    # The snapshot is left exactly as it was given.
    assert positions(snap) == before
    np.testing.assert_allclose(snap.usage.used_mib, used_before, atol=1e-6)

    # Limits.
    assert len(result.moves) <= case.limits.total
    assert max(Counter(m.source for m in result.moves).values(), default=0) <= (
        case.limits.per_node)
    assert max(Counter(m.namespace for m in result.moves).values(), default=0) <= (
        case.limits.per_namespace)

    # No PDB budget goes negative; pods under two PDBs never move.
    spent: Counter[str] = Counter()
    for move in result.moves:
        info = snap.pods[move.pod]
        covering = snap.pdbs_of(info)
        assert len(covering) <= 1
        spent.update(b.key for b in covering)
        assert movability(info, config) is None
    for pdb in snap.pdbs:
        assert spent[pdb.key] <= max(pdb.disruptions_allowed, 0)

    # Replaying the moves in order never over-commits a GPU (or CPU, or memory): ``place``
    # with ``check=True`` raises on any excess.
    state = ClusterState(case.nodes)
    for key, (node, gpus) in before.items():
        state.place(snap.state.pods[key].pod, node, gpus)
    for move in result.moves:
        assert state.pods[move.pod].node == move.source
        old = state.remove_pod(move.pod)
        state.place(old.pod, move.target, move.target_gpus, check=True)
        assert move.target != move.source
    assert (state.gpu_free[: state.size] >= 0).all()
    assert (state.cpu_left[: state.size] >= 0).all()
    # The predicted "after" is what replaying the moves gives.
    assert int(((state.gpu_free[: state.size] == 1000)
                & (np.arange(state.gpu_width)[None, :] < state.gpu_count[: state.size, None])
                ).sum()) == result.after.free_whole_gpus
