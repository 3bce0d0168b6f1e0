"""The fleet-scale harness at its smallest size (issue 26): kwok GPU nodes of the openb mix on
the real control plane, the same pods scheduled by the default scheduler, the zero-cost
extender and gpufrag-scheduler, one after the other, then by two gpufrag-scheduler replicas
whose leader is killed while the pods arrive, with a few GPUs reserved throughout; and a real
defrag cycle over the fleet (benchmarks.fleet_scale at CI size; the large sizes are benchmark
runs, their figures in docs/operations.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.fleet_scale import CI_NODES, CI_PODS, MAX_EVICTIONS, SizeResult, run_size
from devkit.failover import HELD_GPUS
from devkit.fleet import DEFAULT_MAX_DEMAND, make_fleet
from devkit.toolbuild import build_tool
from tests.built import built_or_fail


@pytest.fixture(scope="module")
def kwok() -> Path:
    return built_or_fail("kwok build", lambda: build_tool("kwok"))


@pytest.fixture(scope="module")
def fleet_run(control_plane_binary: Path, kwok: Path) -> SizeResult:
    fleet = make_fleet(CI_NODES, CI_PODS, seed=0, max_demand=DEFAULT_MAX_DEMAND)
    # One leader kill: the lease alone takes 15 s to expire.
    return run_size(control_plane_binary, fleet, seed=0, kills=1, kwok=kwok)


def test_every_pod_is_bound_or_unschedulable_and_running(fleet_run: SizeResult) -> None:
    """The rows end once every pod is bound or the scheduler found no node for it; near all
    are bound (the fleet is filled to 75% of its GPUs with pods some node could hold), and
    kwok ran each bound one (the row waits for that)."""
    pods = len(fleet_run.fleet.pods)
    assert pods > CI_NODES  # the demand cap left a real workload
    for name, row in fleet_run.rows.items():
        assert row.placed.bound + row.placed.unbound == pods, name
        assert row.placed.bound >= 0.95 * pods, name
        assert row.seconds > 0 and row.running_s >= 0, name


def test_gpufrag_over_commits_no_gpu(fleet_run: SizeResult) -> None:
    assert fleet_run.rows["gpufrag-decide"].placed.stranded == 0


def test_gpufrag_fragments_no_more_than_the_default_scheduler(fleet_run: SizeResult) -> None:
    gpufrag, default = (fleet_run.rows[n].placed for n in ("gpufrag-decide", "default"))
    assert gpufrag.frag_pct <= default.frag_pct
    assert gpufrag.allocation_pct >= default.allocation_pct  # runnable pods' GPUs
    # The live scheduler places about what the what-if does with the same pods.
    assert gpufrag.allocation_pct >= fleet_run.whatif[0] - 1.0


def test_the_figures_are_measured(fleet_run: SizeResult) -> None:
    extender = fleet_run.rows["gpufrag-decide"].extender
    for figure in ("rss_mib", "rss_restarted_mib", "ready_s", "filter_p50_ms", "filter_p99_ms",
                   "lag_p50_ms", "lag_max_ms"):
        assert extender[figure] > 0 and math.isfinite(extender[figure]), figure
    assert extender["defrag_exit"] == 0 and extender["defrag_s"] > 0
    assert extender["defrag_api_LIST"] >= 2  # it read the fleet's nodes and pods
    for name, row in fleet_run.rows.items():
        assert all(math.isfinite(ms) and ms > 0 for ms in row.algorithm_ms), name
        assert row.cpu_ms_per_pod["kube-scheduler"] > 0, name
        assert row.cpu_ms_per_pod["kwok"] > 0, name  # kwok marked the pods Running
    assert fleet_run.rows["zero-one"].cpu_ms_per_pod["extender"] > 0


def test_a_real_defrag_cycle_keeps_its_budget_and_brings_every_replica_back(
        fleet_run: SizeResult) -> None:
    """The real cycle over the fleet (movable Deployments among bare pods, usage written as
    the agents would): it evicts within its budget, every replacement is bound by
    gpufrag-scheduler (on the reserved target: ``landed``), every Deployment is back at full
    replicas, and no reservation is left behind."""
    g = fleet_run.rows["gpufrag-decide"].extender
    assert g["defrag_real_exit"] == 0 and g["defrag_usage_nodes"] > 0
    outcomes = {k.removeprefix("defrag_real_outcome_"): v for k, v in g.items()
                if k.startswith("defrag_real_outcome_")}
    assert 1 <= sum(outcomes.values()) <= MAX_EVICTIONS
    assert outcomes.get("landed", 0) >= 1 and set(outcomes) <= {"landed", "landed_elsewhere"}
    assert g["defrag_real_api_POST"] >= 2 * sum(outcomes.values())  # a reservation, an eviction
    assert g["defrag_real_reservations_left"] == 0 and g["defrag_real_back_s"] >= 0


def test_a_leader_kill_loses_no_pod_and_gives_no_gpu_twice(fleet_run: SizeResult) -> None:
    failover = fleet_run.failover
    assert failover is not None and len(failover.first_bind_s) == 1
    assert (failover.lost, failover.double_assigned) == (0, 0)
    # Reserved GPUs stay reserved for every leader: none is handed to an arriving pod.
    assert failover.reserved == HELD_GPUS and failover.reserved_taken == 0
    assert failover.pods == len(fleet_run.fleet.pods)
    assert failover.bound >= 0.95 * failover.pods
    # The standby binds only once the dead leader's lease (15 s) has expired.
    assert 10 < failover.first_bind_s[0] < 120
