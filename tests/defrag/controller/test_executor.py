"""The executor's loop with the dry-run writer and with a recording fake of the same interface
(the real writer is exercised against a real control plane in tests/e2e/test_defrag.py); the
MIG step's relabel against a fake API (and for real in tests/e2e/test_defrag_mig.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from defrag.controller.errors import CycleStopped
from defrag.controller.executor import (
    ClusterActions,
    CycleReport,
    DryRunActions,
    EvictionOutcome,
    Executor,
    KubeActions,
    Landing,
    stale_message,
)
from defrag.controller.ledger import StaleReservation
from defrag.controller.measure import measure
from defrag.controller.metrics import CycleMetrics
from defrag.controller.migplan import Relabel
from defrag.controller.model import PodInfo, Snapshot
from defrag.controller.planner import Move, Plan, plan
from defrag.controller.snapshot import hold_reservations
from scheduler.kube.reservations import Reservation, body
from scheduler.policies import make_policy
from tests.builders import workload
from tests.defrag.controller.builders import config, gpu_node, share, snapshot

WORKLOAD = workload((1000, 1, 1000, 0.5), (1000, 1, 700, 0.5))


class Silent:
    def bind(self, **_: object) -> Silent:
        return self

    def _drop(self, *_: object, **__: object) -> None:
        return None

    info = warning = error = debug = _drop


class RecordingActions:
    """Our ClusterActions interface, in memory: records calls, answers as told."""

    dry_run = False

    def __init__(self, *, refuse: frozenset[str] = frozenset(), fail_on: str = "",
                 never_bind: frozenset[str] = frozenset(),
                 land_on: dict[str, str] | None = None, fail_reserve: int = -1) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.refuse, self.fail_on, self.never_bind = refuse, fail_on, never_bind
        self.land_on = land_on or {}
        self.hints: dict[str, list[tuple[str, float]]] = {}
        self.reservations: dict[str, Reservation] = {}  # live now
        self.reserved: list[Reservation] = []  # every one created
        self.fail_reserve = fail_reserve  # the creation (0-based) that fails

    def reserve(self, reservation: Reservation) -> None:
        if self.fail_reserve == 0:
            raise CycleStopped(f"creating GPUReservation {reservation.name}", "HTTP 403: no")
        self.fail_reserve -= 1
        self.calls.append(("reserve", reservation.name, reservation.node))
        self.reservations[reservation.name] = reservation
        self.reserved.append(reservation)

    def renew_reservation(self, name: str, expires: float) -> None:
        self.calls.append(("renew", name))

    def release(self, name: str) -> None:
        self.calls.append(("release", name))
        del self.reservations[name]

    def report_stale(self, stale: StaleReservation, *, released: bool, now: float) -> None:
        self.calls.append(("report_stale", stale.name))

    def prune_hints(self, now: float) -> int:
        self.calls.append(("prune",))
        return 0

    def put_hint(self, owner_uid: str, node: str, expires: float) -> None:
        self.calls.append(("hint", owner_uid, node))
        self.hints.setdefault(owner_uid, []).append((node, expires))

    def remove_hint(self, owner_uid: str, node: str, expires: float) -> None:
        self.calls.append(("unhint", owner_uid, node))
        self.hints[owner_uid].remove((node, expires))

    def owner_pods(self, pod: PodInfo) -> frozenset[str]:
        return frozenset({pod.uid})

    def evict(self, pod: PodInfo) -> EvictionOutcome:
        if pod.key == self.fail_on:
            raise CycleStopped(f"evicting pod {pod.key}", "HTTP 500: etcd is sad", status=500)
        self.calls.append(("evict", pod.key))
        return "refused" if pod.key in self.refuse else "evicted"

    def await_replacement(self, pod: PodInfo, move: Move, known_uids: frozenset[str],
                          timeout_s: float) -> Landing | None:
        if pod.key in self.never_bind:
            return None
        node = self.land_on.get(pod.key, move.target)
        return Landing(pod=f"{pod.key}-new", uid="new", node=node,
                       gpus=move.target_gpus if node == move.target else None)

    def save_state(self, text: str) -> None:
        self.calls.append(("state", text))


def sources_and_sink() -> Snapshot:
    nodes = [gpu_node(f"s{i}") for i in range(3)] + [gpu_node("t", gpus=4), gpu_node("u")]
    placed = [(share(f"p{i}", 300), f"s{i}", (0,)) for i in range(3)]
    placed += [(share(f"fill{g}", 700, namespace="other"), "t", (g,)) for g in range(4)]
    snap = snapshot(nodes, placed)
    for key in list(snap.pods):  # the sink's pods stay put, to keep the plan simple
        if key.startswith("other/"):
            snap.pods[key] = dataclasses.replace(snap.pods[key], owner_kind="")
    return snap


def make(snap: Snapshot) -> Plan:
    return plan(snap, make_policy("fgd", workload=WORKLOAD), WORKLOAD, config())


def execute(actions: ClusterActions, snap: Snapshot, the_plan: Plan
            ) -> tuple[CycleReport, CycleMetrics]:
    metrics = CycleMetrics(dry_run=False)
    report = Executor(actions, config(), metrics, clock=lambda: 1000.0,
                      log=Silent()).run(the_plan, snap, WORKLOAD)
    return report, metrics


def test_dry_run_lands_everything_as_planned_and_matches_the_prediction() -> None:
    snap = sources_and_sink()
    the_plan = make(snap)
    assert [m.pod for m in the_plan.moves] == ["ns/p0", "ns/p1", "ns/p2"]
    actions = DryRunActions(Silent())
    report, metrics = execute(actions, snap, the_plan)
    assert [r.outcome for r in report.results] == ["landed"] * 3
    assert report.after == the_plan.after and report.error is None
    assert metrics.counts["evicted"] == 3 and metrics.counts["landed on target"] == 3
    assert [w[0] for w in actions.written] == ["reserve"] * 3 + ["hint", "evict"] * 3
    assert {snap.state.pods[f"ns/p{i}"].node for i in range(3)} == {"t"}


def test_every_move_writes_a_hint_evicts_and_removes_the_hint() -> None:
    snap = sources_and_sink()
    actions = RecordingActions()
    report, _ = execute(actions, snap, make(snap))
    names = [f"p{i}-nsp{i}" for i in range(3)]
    assert actions.calls[:9] == [
        ("prune",), *(("reserve", n, "t") for n in names),
        ("hint", "owner-ns/p0", "t"), ("renew", names[0]), ("evict", "ns/p0"),
        ("unhint", "owner-ns/p0", "t"), ("release", names[0])]
    assert actions.reservations == {}  # every reservation released once its pod was bound
    assert all(not v for v in actions.hints.values())  # every hint removed once bound
    # The hint expires hint_ttl_s after "now".
    assert report.error is None and report.committed


def test_a_refused_eviction_is_skipped_and_the_cycle_goes_on() -> None:
    snap = sources_and_sink()
    actions = RecordingActions(refuse=frozenset({"ns/p1"}))
    report, metrics = execute(actions, snap, make(snap))
    assert [r.outcome for r in report.results] == [
        "landed", "refused by PDB", "landed"]
    assert metrics.counts["refused (pdb)"] == 1 and report.error is None
    assert snap.state.pods["ns/p1"].node == "s1"  # the model did not move it
    assert ("unhint", "owner-ns/p1", "t") in actions.calls


def test_an_api_error_stops_the_cycle_and_says_what_was_done() -> None:
    snap = sources_and_sink()
    actions = RecordingActions(fail_on="ns/p1")
    report, metrics = execute(actions, snap, make(snap))
    assert [r.move.pod for r in report.results] == ["ns/p0"]
    assert report.error is not None and "evicting pod ns/p1: HTTP 500" in report.error
    assert metrics.counts["failed (api_error)"] == 1
    assert ("evict", "ns/p2") not in actions.calls


def test_a_replacement_that_never_binds_stops_the_cycle() -> None:
    snap = sources_and_sink()
    report, metrics = execute(RecordingActions(never_bind=frozenset({"ns/p0"})), snap, make(snap))
    assert [r.outcome for r in report.results] == ["bind timeout"]
    assert report.error is not None and "was not bound within" in report.error
    assert metrics.counts["failed (bind_timeout)"] == 1


def test_the_model_follows_a_replacement_that_landed_elsewhere() -> None:
    snap = sources_and_sink()
    report, metrics = execute(RecordingActions(land_on={"ns/p0": "u"}), snap, make(snap))
    assert report.results[0].outcome == "landed elsewhere"
    assert snap.state.pods["ns/p0"].node == "u"
    assert metrics.counts["landed on elsewhere"] == 1


def test_stops_early_when_the_trigger_clears() -> None:
    # Only trigger: a pending 1-GPU pod blocked by n0's stranded share. After the first move it
    # fits on n0, so a second (made-up) move from n0 is not carried out.
    nodes = [gpu_node("n0"), gpu_node("n1")]
    placed = [(share("a", 600), "n0", (0,)), (share("b", 300), "n0", (1,)),
              (share("c", 500), "n1", (0,)), (share("d", 800), "n1", (1,))]
    snap = snapshot(nodes, placed, used_fraction=1.0, pending=[share("p", 1000)])
    the_plan = make(snap)
    assert [m.pod for m in the_plan.moves] == ["ns/b"]
    extra = dataclasses.replace(the_plan.moves[0], pod="ns/a", source_gpus=(0,))
    the_plan = dataclasses.replace(the_plan, moves=(*the_plan.moves, extra))
    actions = RecordingActions()
    report, metrics = execute(actions, snap, the_plan)
    assert [r.move.pod for r in report.results] == ["ns/b"]
    assert report.stopped_early == "no node is triggered any more"
    assert metrics.counts["skipped (trigger_cleared)"] == 1
    assert ("evict", "ns/a") not in actions.calls


def test_report_names_the_owners_that_start_a_cooldown_and_the_nodes_still_latched() -> None:
    snap = sources_and_sink()
    the_plan = make(snap)
    actions = RecordingActions(refuse=frozenset({"ns/p1"}))
    report, _ = execute(actions, snap, the_plan)
    moved = {m.owner_uid for m in the_plan.moves if m.pod != "ns/p1"}
    assert report.moved_owners == moved
    assert "s1" in report.latched_after  # p1 stayed: its node is still over the threshold
    assert not {"s0", "s2"} & report.latched_after
    assert report.triggered_after >= len(report.latched_after)


def test_every_move_is_reserved_before_the_first_eviction_with_the_replacements_share() -> None:
    snap = sources_and_sink()
    the_plan = make(snap)
    actions = RecordingActions(never_bind=frozenset({"ns/p0"}))
    report, _ = execute(actions, snap, the_plan)
    reserved = actions.reserved
    first_evict = next(i for i, c in enumerate(actions.calls) if c[0] == "evict")
    assert [c[0] for c in actions.calls[:first_evict]].count("reserve") == 3
    for move, r in zip(the_plan.moves, reserved, strict=True):
        assert (r.node, r.gpus, r.gpu_milli) == (move.target, move.target_gpus, move.gpu_milli)
        assert r.owner_uid == move.owner_uid and move.uid in r.existing_pods
        assert r.admits(f"{move.namespace}/new", move.owner_uid, "a-new-pod")
        assert not r.admits(f"{move.namespace}/new", "someone-else", "x")
        assert not r.admits("other-tenant/new", move.owner_uid, "a-new-pod")
        assert r.expires == 1000.0 + config().hint_ttl_s
    # p0 never bound: its reservation runs to its TTL; p1 and p2 were never tried: released.
    assert report.error is not None
    assert set(actions.reservations) == {reserved[0].name}


def test_a_plan_that_cannot_reserve_every_move_evicts_nothing_and_rolls_back() -> None:
    snap = sources_and_sink()
    actions = RecordingActions(fail_reserve=2)
    report, metrics = execute(actions, snap, make(snap))
    assert not any(c[0] in ("evict", "hint") for c in actions.calls)
    assert actions.reservations == {}
    assert [c for c in actions.calls if c[0] == "release"] == [
        ("release", "p0-nsp0"), ("release", "p1-nsp1")]
    assert report.results == [] and report.error is not None and not report.committed
    assert "nothing was evicted; 2 reservation(s) rolled back" in report.error
    assert metrics.counts["reservations rolled_back"] == 2
    assert {snap.state.pods[f"ns/p{i}"].node for i in range(3)} == {"s0", "s1", "s2"}


def test_a_right_sized_move_reserves_the_new_share() -> None:
    snap = sources_and_sink()
    snap.rightsized = {"ns/p0": 150}
    the_plan = make(snap)
    move = next(m for m in the_plan.moves if m.pod == "ns/p0")
    assert move.new_milli == 150
    actions = RecordingActions()
    execute(actions, snap, the_plan)
    assert next(r for r in actions.reserved if r.replaces == "ns/p0").gpu_milli == 150


def test_a_share_an_earlier_cycle_still_holds_is_not_planned_into() -> None:
    def targets(snap: Snapshot) -> set[tuple[str, tuple[int, ...]]]:
        return {(m.target, m.target_gpus) for m in make(snap).moves}

    free_plan = targets(sources_and_sink())
    assert ("t", (0,)) in free_plan

    def held(**overrides: object) -> Reservation:
        fields: dict[str, object] = dict(name="left", node="t", gpus=(0,), gpu_milli=300,
                                         owner_uid="earlier-owner", namespace="ns", expires=2000.0)
        fields.update(overrides)
        return Reservation(**fields)  # type: ignore[arg-type]

    snap = sources_and_sink()
    before = measure(snap.state, snap.usage, WORKLOAD).summary
    assert hold_reservations(snap, [body(held()), {"metadata": {"name": "bad"}}], 1000.0) == [
        "GPUReservation bad, field 'spec': expected an object"]
    assert ("t", (0,)) not in targets(snap)
    # Held, it counts as allocated and used: no idle memory is invented for it.
    assert measure(snap.state, snap.usage, WORKLOAD).summary.idle_gib == before.idle_gib
    expired = sources_and_sink()
    hold_reservations(expired, [body(held(expires=999.0))], 1000.0)
    assert targets(expired) == free_plan


def test_a_share_held_on_a_triggered_node_is_not_counted_as_an_unknown_pod() -> None:
    snap = sources_and_sink()
    held = Reservation(name="left", node="s0", gpus=(0,), gpu_milli=300,
                       owner_uid="earlier-owner", namespace="ns", expires=2000.0)
    assert hold_reservations(snap, [body(held)], 1000.0) == []
    assert held.key in snap.state.pods_on_node[snap.state.index["s0"]]
    the_plan = make(snap)
    assert "s0" in the_plan.triggered  # its pods are candidates; the held share is not one
    assert "unknown pod" not in the_plan.skipped


@pytest.mark.parametrize(("managed", "released", "ends"), [
    (True, True, "; released by this cycle"),
    (False, False, "; kept: gpufrag defrag releases only the reservations it made"),
    (True, False, "; kept: its owner's namespace is not one this cycle may move pods in"),
])
def test_the_stale_reservation_event_says_why_and_what_the_cycle_did(
        managed: bool, released: bool, ends: str) -> None:
    stale = StaleReservation("n0-hold", "owner_gone", "ReplicaSet ns/web has no pod", "n0",
                             "ns", managed)
    message = stale_message(stale, released=released)
    assert message == ("holds GPU capacity for nothing (owner_gone): ReplicaSet ns/web has no "
                       "pod" + ends)


class FakeMigCore:
    """CoreV1Api's two calls the relabel makes: the node patch (answering ``status``, or
    200) and the Event."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.patches: list[tuple[str, Any, str]] = []
        self.events: list[dict[str, Any]] = []

    def patch_node(self, name: str, body: Any, *, _content_type: str) -> dict[str, Any]:
        self.patches.append((name, body, _content_type))
        if self.status != 200:
            raise ApiException(status=self.status, reason="Unprocessable Entity")
        return {}

    def create_namespaced_event(self, namespace: str, body: dict[str, Any],
                                _request_timeout: float) -> None:
        self.events.append(body)


def kube_with(core: FakeMigCore) -> KubeActions:
    actions = KubeActions(ApiClient())
    actions.core = core
    return actions


def test_the_relabel_tests_the_label_it_read_then_sets_it_with_a_node_event() -> None:
    core = FakeMigCore()
    assert kube_with(core).relabel_mig(Relabel("mig-0", "all-1g.10gb", "gpufrag-2x3g.40gb"), 1e9)
    ((node, ops, content_type),) = core.patches
    path = "/metadata/labels/nvidia.com~1mig.config"
    assert (node, content_type) == ("mig-0", "application/json-patch+json")
    assert ops == [{"op": "test", "path": path, "value": "all-1g.10gb"},
                   {"op": "add", "path": path, "value": "gpufrag-2x3g.40gb"}]
    (event,) = core.events
    assert (event["type"], event["reason"], event["involvedObject"]["name"]) == (
        "Normal", "MigLayoutChanged", "mig-0")


def test_a_node_relabelled_since_it_was_read_is_left_alone() -> None:
    core = FakeMigCore(status=422)  # the test op failed: someone changed the label
    relabel = Relabel("mig-0", "all-1g.10gb", "gpufrag-2x3g.40gb")
    assert not kube_with(core).relabel_mig(relabel, 1e9)
    assert core.events == []


class HintsConfigMap:
    """The ConfigMap calls of a CoreV1Api on which the hints ConfigMap does not exist yet;
    ``namespace_missing``: nor does its namespace."""

    def __init__(self, *, namespace_missing: bool = False) -> None:
        self.namespace_missing = namespace_missing
        self.created: list[dict[str, Any]] = []

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any) -> None:
        raise ApiException(status=404, reason="Not Found")

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any]) -> None:
        if self.namespace_missing:
            raise ApiException(status=404, reason="Not Found")
        self.created.append(body)


def test_a_missing_hints_configmap_is_made_to_record_the_state_not_a_failed_cycle() -> None:
    actions = KubeActions(ApiClient())
    actions.core = HintsConfigMap()
    actions.save_state("state-1")
    (made,) = actions.core.created
    assert made["metadata"]["annotations"] == {
        actions.names.annotation_defrag_state: "state-1"}
    # Nowhere to record it (no namespace either): a warning, and the cycle goes on.
    actions.core = HintsConfigMap(namespace_missing=True)
    actions.save_state("state-2")
