"""FGD on a two-node cluster checked by hand."""

from __future__ import annotations

import numpy as np

from scheduler.core import choose
from scheduler.policies.fgd import FgdPolicy
from tests.builders import pod, state_with_free, workload

HALF_GPU = workload((0, 1, 500, 1.0))  # the typical task wants 500 milli on one GPU


def test_share_goes_where_it_fills_a_stranded_leftover() -> None:
    # n0 has a 300 leftover that no 500-milli task can use (F = 300); n1 is idle (F = 0).
    state = state_with_free([1000, 300], [1000, 1000])
    fgd = FgdPolicy(HALF_GPU)
    rows = state.active_rows()
    delta, gpu = fgd.delta(state, pod(gpu_milli=300), rows)
    # n0: on GPU1 the leftover is used up (F 300 -> 0); on GPU0 F stays 300. n1: F stays 0.
    assert delta.tolist() == [-300.0, 0.0]
    assert gpu.tolist() == [1, 0]
    scores = fgd.score(state, pod(gpu_milli=300), rows).score
    assert scores.tolist() == [57.0, 50.0]  # floor(100 * sigmoid(0.3)), floor(100 * sigmoid(0))
    decision = choose(state, fgd, pod(gpu_milli=300))
    assert decision is not None and (decision.node, decision.gpus) == ("n0", (1,))


def test_share_avoids_creating_a_leftover() -> None:
    # A 600 share: on an idle GPU it leaves 400 (< 500, stranded); on the 600-free GPU, nothing.
    state = state_with_free([1000, 600])
    delta, gpu = FgdPolicy(HALF_GPU).delta(state, pod(gpu_milli=600), state.active_rows())
    assert gpu.tolist() == [1] and delta.tolist() == [0.0]


def test_whole_gpu_pod_and_cpu_pressure() -> None:
    # A whole GPU on n0 ([1000, 1000]) strands nothing; but taking the CPU makes the typical
    # task (1000 CPU) unable to run, so all remaining free counts.
    cpu_hungry = workload((1000, 1, 500, 1.0))
    state = state_with_free([1000, 1000], [1000, 1000], cpu_milli=4_000)
    rows = state.active_rows()
    delta, _ = FgdPolicy(cpu_hungry).delta(state, pod(cpu_milli=3_500), rows)
    assert delta.tolist() == [1000.0, 1000.0]
    delta, _ = FgdPolicy(cpu_hungry).delta(state, pod(cpu_milli=1_000), rows)
    assert delta.tolist() == [0.0, 0.0]


def test_ties_go_to_the_fixed_node_order() -> None:
    state = state_with_free([1000, 1000], [1000, 1000], [1000, 1000])
    fgd = FgdPolicy(HALF_GPU)
    state.set_tie_order(np.array([2, 0, 1]))
    decision = choose(state, fgd, pod())
    assert decision is not None and decision.node == "n1"
