"""The planner on clusters small enough to check by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from defrag.controller.config import DefragConfig
from defrag.controller.model import (
    DELIVERY_CLAIMS,
    DELIVERY_DIRECT,
    LabelSelector,
    NodeConstraints,
    Pdb,
    PodInfo,
    Snapshot,
)
from defrag.controller.planner import NAMED_CLAIM, Plan, apply_moves, movability, plan
from scheduler.core import TargetWorkload
from scheduler.core.gpus import FIRST_FIT
from scheduler.policies import make_policy
from tests.builders import workload
from tests.defrag.controller.builders import config, gpu_node, positions, share, snapshot

# Half the pods want a whole GPU, half a 300-milli share (CPU 1000 like the builders' pods).
WORKLOAD = workload((1000, 1, 1000, 0.5), (1000, 1, 300, 0.5))


def run(snap: Snapshot, cfg: DefragConfig | None = None,
        wl: TargetWorkload = WORKLOAD) -> Plan:
    return plan(snap, make_policy("fgd", workload=wl), wl, cfg or config())


def three_nodes() -> Snapshot:
    """n0: a (300) alone on GPU0; n1: b, c (600 each) on both GPUs; n2: empty."""
    return snapshot([gpu_node("n0"), gpu_node("n1"), gpu_node("n2")], [
        (share("a", 300), "n0", (0,)), (share("b", 600), "n1", (0,)),
        (share("c", 600), "n1", (1,))])


def test_small_pod_moves_into_a_leftover_and_frees_its_node() -> None:
    # F(n0) = .5*700 (a whole-GPU pod cannot use GPU0's 700) = 350; F(n1) = .5*800 = 400.
    # a -> n1 GPU0 (400 free): F(n0) = 0, F(n1) = .5*(100+400) + .5*100 = 300: Δ = -450.
    snap = three_nodes()
    before = positions(snap)
    result = run(snap)
    assert [(m.pod, m.source, m.target, m.target_gpus) for m in result.moves] == [
        ("ns/a", "n0", "n1", (0,))]
    move = result.moves[0]
    assert move.frag_delta_milli == pytest.approx(-450.0)
    assert move.freed_gpus == 1 and move.unblocks == () and move.reason == "idle 50%"
    assert result.before.free_whole_gpus == 3 and result.after.free_whole_gpus == 4
    assert result.after.frag_gpus == pytest.approx(result.before.frag_gpus - 0.45)
    # n1 received a pod, so its own pods stay this cycle; the snapshot is left as given.
    assert result.skipped == {"source node received a pod this cycle": 2}
    assert positions(snap) == before


def test_plan_is_what_applying_it_gives() -> None:
    snap = three_nodes()
    result = run(snap)
    apply_moves(snap, result.moves)
    assert snap.state.pods["ns/a"].node == "n1"
    assert int(np.sum(snap.state.gpu_free[: snap.state.size] == 1000)) == (
        result.after.free_whole_gpus)


def test_no_move_when_nothing_is_triggered() -> None:
    snap = snapshot([gpu_node("n0"), gpu_node("n1")], [(share("a", 300), "n0", (0,)),
                                                       (share("b", 600), "n1", (0,))],
                    used_fraction=0.9)
    result = run(snap)
    assert result.moves == () and result.triggered == {}


def test_no_move_without_a_feasible_target() -> None:
    # Every other GPU is full: a has nowhere to go.
    snap = snapshot([gpu_node("n0"), gpu_node("n1", gpus=1)], [
        (share("a", 300), "n0", (0,)), (share("b", 1000), "n1", (0,)),
        (share("c", 1000), "n0", (1,))])
    result = run(snap)
    assert result.moves == ()
    assert result.skipped["no node can take it"] >= 1


def test_no_move_that_does_not_improve() -> None:
    # a would land on an empty GPU of n1 and free nothing: one whole GPU traded for another.
    snap = snapshot([gpu_node("n0"), gpu_node("n1")], [
        (share("a", 300), "n0", (0,)), (share("b", 600), "n0", (1,))])
    result = run(snap)
    assert result.moves == ()
    assert "no landing improves the cluster" in result.skipped


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"owner_kind": "DaemonSet"}, "DaemonSet pod"),
        ({"owner_kind": ""}, "bare pod (no controller)"),
        ({"owner_kind": "Node"}, "owner kind Node is not movable"),
        ({"opted_out": True}, "opted out (gpufrag.io/defrag-movable=false)"),
        ({"priority": 2_000_000_000}, "priority above --max-priority"),
        ({"running": False}, "not running"),
        ({"deleting": True}, "terminating"),
    ],
)
def test_unmovable_pods_stay(change: dict[str, Any], reason: str) -> None:
    snap = three_nodes()
    snap.pods["ns/a"] = dataclasses.replace(snap.pods["ns/a"], **change)
    result = run(snap)
    assert all(m.pod != "ns/a" for m in result.moves)
    assert result.skipped.get(reason) == 1


def test_movability_of_big_and_system_pods() -> None:
    cfg = config(max_pod_gpus=1)
    big = PodInfo(key="ns/big", request=share("big", 1000, num_gpu=2), owner_kind="Job")
    assert movability(big, cfg) == "more GPUs than --max-pod-gpus"
    system = PodInfo(key="kube-system/x", request=share("x", 100, namespace="kube-system"),
                     owner_kind="ReplicaSet")
    assert movability(system, cfg) == "namespace excluded"
    cpu = PodInfo(key="ns/c", request=share("c", 0, num_gpu=0), owner_kind="ReplicaSet")
    assert movability(cpu, cfg) == "no GPU"
    web = PodInfo(key="ns/w", request=share("w", 100), owner_kind="ReplicaSet")
    assert movability(web, config(namespaces=frozenset({"serving"}))) == (
        "namespace not selected (--namespaces)")
    assert movability(web, config(namespaces=frozenset({"ns"}))) is None


# Shares of 700 are popular here, so a 300 share is best put where only 300 is left: the sink.
SINK_WORKLOAD = workload((1000, 1, 1000, 0.5), (1000, 1, 700, 0.5))


def sources_and_sink(namespaces: tuple[str, ...] = ("ns",) * 4) -> Snapshot:
    """Four 2-GPU nodes each holding one 300 share; a 4-GPU sink with 300 free on each GPU."""
    nodes = [gpu_node(f"s{i}") for i in range(4)] + [gpu_node("t", gpus=4)]
    placed = [(share(f"p{i}", 300, namespace=ns), f"s{i}", (0,))
              for i, ns in enumerate(namespaces)]
    placed += [(share(f"fill{g}", 700, namespace="other"), "t", (g,)) for g in range(4)]
    return snapshot(nodes, placed)


def test_total_limit() -> None:
    result = run(sources_and_sink(), config(total=2), SINK_WORKLOAD)
    assert len(result.moves) == 2 and {m.target for m in result.moves} == {"t"}
    assert result.skipped["--max-evictions-total reached"] >= 1
    unlimited = run(sources_and_sink(), config(total=10), SINK_WORKLOAD)
    assert len(unlimited.moves) == 4
    assert unlimited.after.free_whole_gpus == unlimited.before.free_whole_gpus + 4


def test_namespace_limit() -> None:
    result = run(sources_and_sink(("a", "a", "b", "b")), config(per_namespace=1), SINK_WORKLOAD)
    assert sorted(m.namespace for m in result.moves) == ["a", "b"]
    assert result.skipped["--max-evictions-per-namespace reached"] == 2


def test_node_limit() -> None:
    nodes = [gpu_node("s", gpus=4), gpu_node("t", gpus=4)]
    placed = [(share(f"p{g}", 300), "s", (g,)) for g in range(4)]
    placed += [(share(f"fill{g}", 700, namespace="other"), "t", (g,)) for g in range(4)]
    result = run(snapshot(nodes, placed), config(per_node=3), SINK_WORKLOAD)
    assert len(result.moves) == 3
    assert result.skipped["--max-evictions-per-node reached"] == 1


def test_pdb_headroom_is_spent_as_moves_are_planned() -> None:
    snap = sources_and_sink()
    for key, info in list(snap.pods.items()):
        snap.pods[key] = dataclasses.replace(info, labels={"app": "web"})
    snap.pdbs = [Pdb("ns", "web", LabelSelector({"app": "web"}), disruptions_allowed=1)]
    result = run(snap, wl=SINK_WORKLOAD)
    assert len(result.moves) == 1 and result.moves[0].pdb == "ns/web"
    assert result.skipped["PodDisruptionBudget allows no more disruptions"] == 3
    snap.pdbs = [Pdb("ns", "web", LabelSelector({"app": "web"}), disruptions_allowed=0)]
    # (The sink's own pods, in another namespace and under no PDB, may still move.)
    assert all(m.namespace != "ns" for m in run(snap, wl=SINK_WORKLOAD).moves)
    snap.pdbs = [Pdb("ns", "web", LabelSelector({"app": "web"}), 5),
                 Pdb("ns", "all", LabelSelector(), 5)]
    result = run(snap, wl=SINK_WORKLOAD)
    assert all(m.namespace != "ns" for m in result.moves)
    assert result.skipped["covered by more than one PodDisruptionBudget"] == 4


def test_pending_pod_blocked_by_stranded_share_is_unblocked() -> None:
    # No idle memory anywhere (pods use all they reserve); a 1-GPU pod is pending although n0 has
    # 1100 milli free: moving b (300, alone on GPU1) off n0 frees a whole GPU for it.
    nodes = [gpu_node("n0"), gpu_node("n1")]
    placed = [(share("a", 600), "n0", (0,)), (share("b", 300), "n0", (1,)),
              (share("c", 500), "n1", (0,)), (share("d", 800), "n1", (1,))]
    waiting = share("p", 1000)
    snap = snapshot(nodes, placed, used_fraction=1.0, pending=[waiting])
    result = run(snap)
    assert result.triggered == {"n0": "blocks 1 pending pod"}
    assert result.unplaceable == ("ns/p",)
    assert [(m.pod, m.target, m.unblocks) for m in result.moves] == [("ns/b", "n1", ("ns/p",))]


def test_memory_in_use_must_fit_the_target_share() -> None:
    # A 500 share on a 32 GiB GPU reserves 16 GiB; on a 16 GiB T4 it would reserve 8 GiB.
    nodes = [gpu_node("big", gpu_memory_mib=32_768, gpu_product="V100M32"), gpu_node("t4")]
    placed = [(share("a", 500), "big", (0,)), (share("f", 400), "t4", (0,))]
    heavy = run(snapshot(nodes, placed, used_fraction=0.7))  # uses 11.2 GiB: 8 is too little
    assert all(m.pod != "ns/a" for m in heavy.moves)
    skipped = "memory it used over the window would not fit its share of the target GPU"
    assert heavy.skipped[skipped] == 1
    light = run(snapshot(nodes, placed, used_fraction=0.25))  # uses 4 GiB
    move = next(m for m in light.moves if m.pod == "ns/a")
    assert move.target == "t4"
    # Idle before 16 - 4 = 12 GiB on big; after 8 - 4 = 4 GiB on t4.
    assert move.idle_delta_mib == pytest.approx(-8 * 1024)


def test_node_selector_and_cordon_limit_targets() -> None:
    snap = three_nodes()
    snap.pods["ns/a"] = dataclasses.replace(
        snap.pods["ns/a"], constraints=NodeConstraints(selector=(("pool", "gold"),)))
    result = run(snap)
    assert all(m.pod != "ns/a" for m in result.moves)
    assert result.skipped["no node can take it"] == 1
    snap = three_nodes()
    snap.cordoned = frozenset({"n1"})
    assert all(m.target != "n1" for m in run(snap).moves)


def test_zero_budget_plans_nothing() -> None:
    assert run(three_nodes(), config(total=0)).moves == ()


def test_plan_as_dict_is_json_ready() -> None:
    import json

    doc = run(three_nodes()).as_dict()
    text = json.dumps(doc)
    assert '"source": "n0"' in text and doc["predicted_after"]["free_whole_gpus"] == 4


def test_a_right_sized_replacement_cuts_idle_and_the_plan_says_so() -> None:
    # One over-reserved pod (600 milli, uses half) alone on n0; its workload is in auto mode
    # with a 300-milli recommendation. Moving it anywhere as is would change nothing worth an
    # eviction; as a right-sized replica it gives back 300 milli of idle memory.
    snap = snapshot([gpu_node("n0", gpus=1), gpu_node("n1", gpus=1)],
                    [(share("a", 600), "n0", (0,)), (share("b", 400), "n1", (0,))])
    plain = run(snap)
    snap.rightsized = {"ns/a": 300}
    sized = run(snap)
    assert len(sized.moves) == 1
    move = sized.moves[0]
    assert move.pod == "ns/a" and move.new_milli == 300
    assert move.idle_delta_mib < 0 and "idle" in move.purposes
    assert move.as_dict()["purposes"] == list(move.purposes)
    assert sized.after.idle_ratio < sized.before.idle_ratio
    assert all("idle" not in m.purposes for m in plain.moves)
    before = positions(snap)
    apply_moves(snap, sized.moves)
    assert snap.state.pods["ns/a"].pod.gpu_milli == 300 and positions(snap) != before


def dra_three_nodes() -> Snapshot:
    """n0: a (300) alone on GPU0; n1: b (500) on GPU0, c (600) on GPU1, both bare (they stay);
    n2: empty. FGD would put a on n1's GPU1 (the tighter leftover), DRA's first fit takes
    n1's GPU0."""
    snap = snapshot([gpu_node("n0"), gpu_node("n1"), gpu_node("n2")], [
        (share("a", 300), "n0", (0,)), (share("b", 500), "n1", (0,)),
        (share("c", 600), "n1", (1,))])
    for key in ("ns/b", "ns/c"):
        snap.pods[key] = dataclasses.replace(snap.pods[key], owner_kind="")
    return snap


def test_a_pod_with_claims_is_planned_onto_the_gpu_first_fit_gives() -> None:
    """A replacement asking through new claims gets the GPU kube-scheduler's allocator takes
    (first fit, in slice order), so the move and its reservation name that GPU, not the one
    FGD would pick for a device-plugin pod."""
    by_plugin = run(dra_three_nodes())
    assert [(m.pod, m.target, m.target_gpus) for m in by_plugin.moves] == [
        ("ns/a", "n1", (1,))]
    snap = dra_three_nodes()
    snap.pods["ns/a"] = dataclasses.replace(snap.pods["ns/a"], delivery=DELIVERY_CLAIMS)
    wl = WORKLOAD
    dra_policy = make_policy("fgd", workload=wl, device_choice=FIRST_FIT)
    through_claims = plan(snap, make_policy("fgd", workload=wl), wl, config(), dra_policy)
    assert [(m.pod, m.target, m.target_gpus) for m in through_claims.moves] == [
        ("ns/a", "n1", (0,))]


def test_a_pod_whose_spec_names_its_claim_is_not_moved() -> None:
    snap = dra_three_nodes()
    snap.pods["ns/a"] = dataclasses.replace(snap.pods["ns/a"], delivery=DELIVERY_DIRECT)
    assert movability(snap.pods["ns/a"], config()) == NAMED_CLAIM
    result = run(snap)
    assert all(m.pod != "ns/a" for m in result.moves)
    assert result.skipped.get(NAMED_CLAIM) == 1
