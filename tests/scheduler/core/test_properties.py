"""Properties over generated clusters and pod streams, for every policy."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import (
    ClusterState,
    NodeSpec,
    PodRequest,
    ScoreCache,
    TargetWorkload,
    choose,
    node_fragmentation,
)
from scheduler.core.gpus import DEVICE_CHOICES, FIRST_FIT, DeviceChoice
from scheduler.policies import ALL_POLICY_NAMES, POLICY_NAMES, make_policy

nodes_st = st.lists(
    st.builds(lambda i, cpu, gpus, prod: (cpu, gpus, prod),
              st.integers(), st.integers(1_000, 64_000), st.integers(0, 8),
              st.sampled_from(["T4", "V100M16", "G2"])),
    min_size=1, max_size=8,
)


@st.composite
def pods_st(draw: st.DrawFn) -> list[PodRequest]:
    out = []
    for i in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        num_gpu, milli = {"cpu": (0, 0), "share": (1, draw(st.integers(1, 999))),
                          "whole": (draw(st.integers(1, 8)), 1000)}[kind]
        spec = draw(st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"G2", "V100M16"})]))
        out.append(PodRequest(name=f"p{i}", cpu_milli=draw(st.integers(0, 16_000)),
                              memory_mib=draw(st.integers(0, 4096)), num_gpu=num_gpu,
                              gpu_milli=milli, gpu_spec=spec if num_gpu else frozenset()))
    return out


def build(nodes: list[tuple[int, int, str]]) -> ClusterState:
    return ClusterState(NodeSpec(name=f"n{i}", cpu_milli=c, memory_mib=65_536, gpu_count=g,
                                 gpu_product=p) for i, (c, g, p) in enumerate(nodes))


@settings(max_examples=60, deadline=None)
@given(nodes_st, pods_st(), st.sampled_from(POLICY_NAMES))
def test_placements_never_exceed_capacity_and_fragmentation_is_bounded(
        nodes: list[tuple[int, int, str]], pods: list[PodRequest], name: str) -> None:
    state = build(nodes)
    target = TargetWorkload.from_pods(pods)
    policy = make_policy(name, workload=target, seed=1)
    cache = ScoreCache(policy) if policy.node_local else None
    for p in pods:
        d = choose(state, policy, p, cache=cache)
        if d is not None:
            state.place(p, d.row, d.gpus)  # checked placement: raises on any over-commit
    n = state.size
    assert (state.cpu_left[:n] >= 0).all() and (state.mem_left[:n] >= 0).all()
    assert (state.gpu_free[:n] >= 0).all() and (state.gpu_free[:n] <= 1000).all()
    frag = node_fragmentation(state, target)
    free = state.gpu_free_total()
    assert (frag >= -1e-9).all() and (frag <= free + 1e-9).all()


@settings(max_examples=40, deadline=None)
@given(nodes_st, pods_st(), st.sampled_from([p for p in POLICY_NAMES if p != "random"]))
def test_cached_scores_equal_fresh_scores(nodes: list[tuple[int, int, str]],
                                          pods: list[PodRequest], name: str) -> None:
    state = build(nodes)
    policy = make_policy(name, workload=TargetWorkload.from_pods(pods))
    cache = ScoreCache(policy)
    for p in pods:
        cached = choose(state, policy, p, cache=cache)
        fresh = choose(state, policy, p)
        assert cached == fresh
        if cached is not None:
            state.place(p, cached.row, cached.gpus)
    rows = state.active_rows()
    for p in pods[:5]:
        assert np.array_equal(cache.score(state, p, rows).score, policy.score(state, p, rows).score)


@settings(max_examples=40, deadline=None)
@given(nodes_st, pods_st(), st.sampled_from([p for p in POLICY_NAMES if p != "random"]),
       st.booleans(), st.randoms(use_true_random=False))
def test_the_incremental_choice_over_all_rows_follows_every_kind_of_change(
        nodes: list[tuple[int, int, str]], pods: list[PodRequest], name: str, kss: bool,
        rnd: random.Random) -> None:
    """The cache's per-shape view (fit and score re-checked only on changed rows) decides as
    a fresh look at every active row does, while pods leave, nodes go and come back, and the
    tie order changes."""
    state = build(nodes)
    policy = make_policy(name, workload=TargetWorkload.from_pods(pods), kss_compat=kss)
    cache = ScoreCache(policy)
    placed: list[str] = []
    for step, p in enumerate(pods):
        assert choose(state, policy, p, cache=cache) == choose(state, policy, p)
        decision = choose(state, policy, p, cache=cache)
        if decision is not None:
            state.place(p, decision.row, decision.gpus)
            placed.append(p.name)
        if step % 5 == 4 and placed:
            state.remove_pod(placed.pop(rnd.randrange(len(placed))))
        if step % 7 == 6:
            gone = state.node_spec(rnd.randrange(state.size))
            placed = [k for k in placed if k not in state.pods_on_node[state.index[gone.name]]]
            state.remove_node(gone.name)
            if step % 2:
                state.add_node(gone)  # back, empty
        if step % 11 == 10:
            state.set_tie_order(np.array(rnd.sample(range(state.size), state.size), np.int64))


@settings(max_examples=40, deadline=None)
@given(nodes_st, pods_st(), st.sampled_from(ALL_POLICY_NAMES), st.sampled_from(DEVICE_CHOICES))
def test_every_device_choice_places_within_capacity_and_first_fit_takes_the_first(
        nodes: list[tuple[int, int, str]], pods: list[PodRequest], name: str,
        device_choice: DeviceChoice) -> None:
    """Whoever picks the GPU, the node is the policy's and nothing is over-committed; under
    DRA's first fit a share never skips a GPU that could hold it."""
    state = build(nodes)
    policy = make_policy(name, workload=TargetWorkload.from_pods(pods), seed=1,
                         device_choice=device_choice)
    cache = ScoreCache(policy) if policy.node_local else None
    for p in pods:
        d = choose(state, policy, p, cache=cache, device_choice=device_choice)
        if d is None:
            continue
        if device_choice == FIRST_FIT and p.is_share:
            free = state.gpu_free[d.row]
            assert (free[: d.gpus[0]] < p.gpu_milli).all() and free[d.gpus[0]] >= p.gpu_milli
        state.place(p, d.row, d.gpus)  # checked placement: raises on any over-commit
