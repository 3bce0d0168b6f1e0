"""GPU reservations: the object's format, and the extender honouring it (filter, bind, release)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.errors import BadInput
from scheduler.extender.verbs.bind import BindRefused
from scheduler.kube.convert import node_to_k8s
from scheduler.kube.podwarning import PodWarning
from scheduler.kube.reservations import (
    Reservation,
    ReservationSink,
    body,
    reservation_from_k8s,
)
from scheduler.kube.skipreport import EVENT_REASON_RESERVATION_REFUSED, skip_event
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock, k8s_pod, serve

NOW = 1_000_000.0
OWNER = "rs-uid"


def reservation(**overrides: Any) -> Reservation:
    fields: dict[str, Any] = dict(
        name="r1", node="n0", gpus=(0,), gpu_milli=300, owner_uid=OWNER, owner_kind="ReplicaSet",
        owner_name="web-1", namespace="default", existing_pods=frozenset({"old-uid"}),
        expires=NOW + 600, replaces="default/web-1-a")
    fields.update(overrides)
    return Reservation(**fields)


def test_the_object_reads_back_what_was_written() -> None:
    r = reservation()
    assert reservation_from_k8s(body(r)) == r
    assert body(r)["spec"]["expiresAt"] == "1970-01-12T13:56:40Z"


@pytest.mark.parametrize(("edit", "field"), [
    (lambda s: s.pop("node"), "spec.node"),
    (lambda s: s.update(gpus=[]), "spec.gpus"),
    (lambda s: s.update(gpus=[0, 0]), "spec.gpus"),
    (lambda s: s.update(gpus=[0, 1], gpuMilli=300), "spec.gpuMilli"),
    (lambda s: s.update(gpuMilli=1001), "spec.gpuMilli"),
    (lambda s: s.update(gpuMilli=True), "spec.gpuMilli"),
    (lambda s: s["owner"].update(uid=""), "spec.owner.uid"),
    (lambda s: s["owner"].update(namespace=""), "spec.owner.namespace"),
    (lambda s: s["owner"].pop("namespace"), "spec.owner.namespace"),
    (lambda s: s.update(existingPods="x"), "spec.existingPods"),
    (lambda s: s.update(expiresAt="tomorrow"), "spec.expiresAt"),
])
def test_a_bad_field_is_named(edit: Any, field: str) -> None:
    obj = body(reservation())
    edit(obj["spec"])
    with pytest.raises(BadInput) as info:
        reservation_from_k8s(obj)
    assert info.value.field == field


def setup(clock: FakeClock, *pods: dict[str, Any]) -> Any:
    # n0: GPU 0 has 300 milli left (a 700 anchor), GPU 1 is full; n1: its only GPU is full.
    anchors = [k8s_pod(pod("a0", gpu_milli=700), node="n0", gpus=(0,), uid="a0"),
               k8s_pod(pod("a1"), node="n0", gpus=(1,), uid="a1"),
               k8s_pod(pod("a2"), node="n1", gpus=(0,), uid="a2")]
    runtime = serve([node("n0"), node("n1", gpu_count=1)], [*anchors, *pods], clock=clock)
    sink = ReservationSink(runtime.cache.reservations, runtime.cache.lock)
    return runtime, sink


def passes(runtime: Any, obj: dict[str, Any]) -> list[str]:
    verdicts = runtime.extender.filter(obj, ["n0", "n1"])
    return [n for n, ok in zip(["n0", "n1"], verdicts.passed.tolist(), strict=True) if ok]


def test_a_reserved_share_is_taken_for_every_pod_but_the_replacement() -> None:
    clock = FakeClock(NOW)
    runtime, sink = setup(clock)
    competitor = k8s_pod(pod("other", gpu_milli=300), uid="c1", owner="other-rs")
    replacement = k8s_pod(pod("web-1-b", gpu_milli=300), uid="new", owner=OWNER)
    existing = k8s_pod(pod("web-1-c", gpu_milli=300), uid="old-uid", owner=OWNER)
    assert passes(runtime, competitor) == ["n0"]
    sink.upsert(body(reservation()))
    assert passes(runtime, competitor) == []
    assert passes(runtime, existing) == []  # a replica that was there already: not its own
    assert passes(runtime, replacement) == ["n0"]
    assert passes(runtime, competitor) == []  # put back after the replacement was judged
    assert runtime.cache.counts()["pods_placed"] == 3


def _in(namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


def _not_controller(obj: dict[str, Any]) -> dict[str, Any]:
    refs = [{**ref, "controller": False} for ref in obj["metadata"]["ownerReferences"]]
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": refs}}


def test_another_tenant_naming_the_owner_cannot_take_the_reservation() -> None:
    """Anyone with ``create pods`` can write an ownerReference naming another tenant's
    ReplicaSet UID: it counts only in the owner's namespace, and only as the controller."""
    clock = FakeClock(NOW)
    thief = _in("tenant-b", k8s_pod(pod("thief", gpu_milli=300), uid="t1", owner=OWNER))
    runtime, sink = setup(clock, thief)
    sink.upsert(body(reservation()))
    book = runtime.cache.reservations
    heard: list[PodWarning] = []
    book.on_refused = heard.append
    assert passes(runtime, thief) == []  # an ordinary pod: the reserved share is taken
    with pytest.raises(BindRefused, match="does not fit node n0 now"):
        runtime.extender.bind("tenant-b", "thief", "t1", "n0")
    assert len(book) == 1 and book.used == 0 and book.refused == 1  # counted once per pod
    (refusal,) = heard  # ... and one Event for it
    assert (refusal.key, refusal.uid) == ("tenant-b/thief", "t1")
    namespace, event = skip_event(refusal, instance="x", now_s=0)
    assert (namespace, event["reason"], event["type"]) == (
        "tenant-b", EVENT_REASON_RESERVATION_REFUSED, "Warning")
    assert "GPU reservation r1, which only that owner's pods in namespace default may use" in \
        event["message"]
    # A reference that is not the controller's counts for nothing, in the owner's namespace too.
    helper = _not_controller(k8s_pod(pod("helper", gpu_milli=300), uid="h1", owner=OWNER))
    assert passes(runtime, helper) == []
    # The owner's own replacement still takes it.
    replacement = k8s_pod(pod("web-1-b", gpu_milli=300), uid="new", owner=OWNER)
    assert passes(runtime, replacement) == ["n0"]


def test_bind_uses_the_reservation_and_the_watch_confirms_it() -> None:
    clock = FakeClock(NOW)
    replacement = k8s_pod(pod("web-1-b", gpu_milli=300), uid="new", owner=OWNER)
    runtime, sink = setup(clock, replacement)
    sink.upsert(body(reservation()))
    outcome = runtime.extender.bind("default", "web-1-b", "new", "n0")
    assert (outcome.node, outcome.gpus) == ("n0", (0,))
    book = runtime.cache.reservations
    assert len(book) == 0 and book.used == 1
    state = runtime.cache.state
    assert int(state.gpu_free[state.index["n0"], 0]) == 0  # held once, by the pod itself
    runtime.cache.apply_pod({**replacement, "spec": {**replacement["spec"], "nodeName": "n0"}})
    assert book.taken == {}
    sink.upsert(body(reservation()))  # a relist after the bind: already used, not held again
    assert len(book) == 0


def test_a_failed_bind_gives_the_reservation_back() -> None:
    clock = FakeClock(NOW)
    replacement = k8s_pod(pod("web-1-b", gpu_milli=300), uid="new", owner=OWNER)
    runtime, sink = setup(clock, replacement)
    sink.upsert(body(reservation()))
    runtime.extender.bind("default", "web-1-b", "new", "n0")
    runtime.cache.forget("default/web-1-b")
    competitor = k8s_pod(pod("other", gpu_milli=300), uid="c1", owner="other-rs")
    assert len(runtime.cache.reservations) == 1
    assert passes(runtime, competitor) == []


def test_a_replacement_bound_elsewhere_releases_it_and_the_ttl_ends_it() -> None:
    clock = FakeClock(NOW)
    runtime, sink = setup(clock)
    competitor = k8s_pod(pod("other", gpu_milli=300), uid="c1", owner="other-rs")
    sink.upsert(body(reservation()))
    sink.upsert(body(reservation(name="r2", node="n0", gpus=(0,), gpu_milli=300,
                                 expires=NOW + 60, owner_uid="job-uid")))
    clock.advance(61)
    runtime.extender.maintain()
    assert set(runtime.cache.reservations.live) == {"r1"}
    # Bound by another path (the watch shows it on the reserved node): released there.
    runtime.cache.apply_pod(k8s_pod(pod("web-1-b", gpu_milli=300), uid="new", owner=OWNER,
                                    node="n0", gpus=(0,)))
    assert len(runtime.cache.reservations) == 0
    assert passes(runtime, competitor) == []  # the replacement itself holds the share now


def test_expired_deleted_and_unreadable_reservations_hold_nothing() -> None:
    clock = FakeClock(NOW)
    runtime, sink = setup(clock)
    competitor = k8s_pod(pod("other", gpu_milli=300), uid="c1", owner="other-rs")
    sink.replace([body(reservation(expires=NOW - 1)), {"metadata": {"name": "bad"}}])
    assert passes(runtime, competitor) == ["n0"]
    sink.upsert(body(reservation()))
    assert passes(runtime, competitor) == []
    sink.delete(body(reservation()))
    assert passes(runtime, competitor) == ["n0"]


def test_a_reservation_for_a_node_not_seen_yet_is_held_once_it_arrives() -> None:
    clock = FakeClock(NOW)
    runtime, sink = setup(clock)
    sink.upsert(body(reservation(node="n2")))
    assert "<reservation>/r1" not in runtime.cache.state.pods
    runtime.cache.apply_node(node_to_k8s(node("n2", gpu_count=1)))
    assert runtime.cache.state.pods["<reservation>/r1"].node == "n2"
    runtime.cache.delete_node("n2")
    runtime.cache.apply_node(node_to_k8s(node("n2", gpu_count=1)))
    assert runtime.cache.state.pods["<reservation>/r1"].node == "n2"
