"""choose_victims: the one-kernel-call-per-size search gives exactly what trying each subset in
turn gives (the rule, spelled out naively below as the oracle), on random nodes and pods."""

from __future__ import annotations

from itertools import combinations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from scheduler.core import ClusterState, NodeSpec, PodRequest, TargetWorkload, choose
from scheduler.core.fragmentation import fragmentation_of
from scheduler.core.preemption import MAX_EXHAUSTIVE_VICTIMS, choose_victims, victim_inputs
from scheduler.core.state import pod_key
from scheduler.core.types import MILLI_PER_GPU
from scheduler.policies import make_policy


def naive(state: ClusterState, workload: TargetWorkload, pod: PodRequest, row: int,
          keys: list[str]) -> tuple[str, ...] | None:
    """Each subset of each size in combinations order, placed the core's way and scored
    alone; the first least-fragmenting subset of the smallest size that fits."""
    count = int(state.gpu_count[row])
    if pod.num_gpu > count:
        return None
    sizes = range(len(keys) + 1) if len(keys) <= MAX_EXHAUSTIVE_VICTIMS else (len(keys),)
    for size in sizes:
        best: tuple[float, tuple[str, ...]] | None = None
        for subset in combinations(keys, size):
            free = state.gpu_free[row].copy()
            cpu, mem = int(state.cpu_left[row]), int(state.mem_left[row])
            for key in subset:
                placed = state.pods[key]
                cpu += placed.pod.cpu_milli
                mem += placed.pod.memory_mib
                for g in placed.gpus:
                    free[g] += placed.pod.gpu_milli
            if cpu < pod.cpu_milli or mem < pod.memory_mib:
                continue
            usable = free[:count]
            if pod.is_share:
                fits = [g for g in range(count) if usable[g] >= pod.gpu_milli]
                if not fits:
                    continue
                free[min(fits, key=lambda g: (usable[g], g))] -= pod.gpu_milli
            else:
                whole = [g for g in range(count) if usable[g] == MILLI_PER_GPU]
                if len(whole) < pod.num_gpu:
                    continue
                for g in whole[:pod.num_gpu]:
                    free[g] = 0
            frag = float(fragmentation_of(free[None, :], np.array([cpu - pod.cpu_milli]),
                                          state.product[row:row + 1], workload,
                                          workload.allowed(state))[0])
            if best is None or frag < best[0]:
                best = (frag, subset)
        if best is not None:
            return best[1]
    return None


pods_st = st.lists(st.tuples(st.sampled_from(["share", "whole"]), st.integers(1, 999),
                             st.integers(1, 4), st.integers(0, 8_000)), min_size=1, max_size=14)


def request(i: int, kind: str, milli: int, gpus: int, cpu: int) -> PodRequest:
    if kind == "share":
        return PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=512, num_gpu=1, gpu_milli=milli)
    return PodRequest(name=f"p{i}", cpu_milli=cpu, memory_mib=512, num_gpu=gpus,
                      gpu_milli=MILLI_PER_GPU)


@settings(max_examples=120, deadline=None)
@given(pods_st, st.tuples(st.sampled_from(["share", "whole"]), st.integers(1, 999),
                          st.integers(1, 4), st.integers(0, 30_000)),
       st.integers(1, 8), st.integers(8_000, 64_000))
def test_the_search_equals_trying_each_subset(placed: list[tuple[str, int, int, int]],
                                              asked: tuple[str, int, int, int], gpus: int,
                                              cpu: int) -> None:
    state = ClusterState([NodeSpec(name="n0", cpu_milli=cpu, memory_mib=65_536,
                                   gpu_count=gpus, gpu_product="T4")])
    pods = [request(i, *p) for i, p in enumerate(placed)]
    workload = TargetWorkload.from_pods([*pods, request(99, *asked)])
    policy = make_policy("fgd", workload=workload)
    keys = []
    for p in pods:
        decision = choose(state, policy, p)
        if decision is not None:
            state.place(p, decision.row, decision.gpus)
            keys.append(pod_key(p))
    assert all(k in state.pods for k in keys)
    preemptor = request(99, *asked)
    event(f"candidates: {min(len(keys), 3)}+")
    inputs = victim_inputs(state, workload, preemptor, 0, keys)
    chosen = None if inputs is None else choose_victims(inputs)
    assert chosen == naive(state, workload, preemptor, 0, keys)
