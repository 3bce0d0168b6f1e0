"""Which pod an Allocate call is for, and which GPUs each container gets."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from gpufrag.conventions import DEFAULT_NAMES, RESOURCE_GPU, RESOURCE_GPU_MILLI
from node.deviceplugin.config import Kind
from node.deviceplugin.matching import (
    Candidate,
    Refusal,
    find,
    holders,
    idle_gpus,
    pod_ask,
    resolve,
    takes_kubelet_choice,
)
from tests.node.deviceplugin.builders import NODE, UUIDS, ask, build_board, build_pod


def _find(pods: list[dict[str, object]], kind: Kind, count: int,
          given: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None
          ) -> Candidate | Refusal:
    resource = RESOURCE_GPU if kind is Kind.WHOLE else RESOURCE_GPU_MILLI
    return find([ask(p) for p in pods], kind, count, node=NODE, resource=resource,
                given=given or {})


def _name(found: Candidate | Refusal) -> str:
    assert isinstance(found, Candidate), found
    return found.pod.name


def test_a_pod_asking_no_gpu_is_not_tracked() -> None:
    assert pod_ask(build_pod("cpu", containers={"main": 0}), DEFAULT_NAMES,
                   annotation_allocated="x/y") is None


def test_oldest_waiting_pod_with_the_same_request_is_chosen() -> None:
    pods = [build_pod("young", whole=1, created="2026-01-01T00:00:09Z"),
            build_pod("old", whole=1, created="2026-01-01T00:00:01Z"),
            build_pod("older-but-two", whole=2, gpus="0,1", created="2026-01-01T00:00:00Z")]
    assert _name(_find(pods, Kind.WHOLE, 1)) == "old"
    assert _name(_find(pods, Kind.WHOLE, 2)) == "older-but-two"


def test_creation_ties_break_by_namespace_then_name() -> None:
    pods = [build_pod("b", whole=1), build_pod("a", whole=1, namespace="z"),
            build_pod("c", whole=1, namespace="a")]
    assert _name(_find(pods, Kind.WHOLE, 1)) == "c"


@pytest.mark.parametrize(("override", "why"), [
    ({"node": "other-node"}, "bound elsewhere"),
    ({"phase": "Running"}, "already running"),
    ({"deleting": True}, "being deleted"),
    ({"allocated": {"main": [UUIDS[0]]}}, "already allocated (annotation)"),
    ({"milli": 1, "whole": 0}, "another resource"),
])
def test_pods_that_are_not_candidates(override: dict[str, object], why: str) -> None:
    pod = build_pod("x", **{"whole": 1, **override})  # type: ignore[arg-type]
    assert isinstance(_find([pod], Kind.WHOLE, 1), Refusal), why


def test_a_container_recorded_in_memory_is_skipped_before_its_mark_arrives() -> None:
    pods = [build_pod("first", whole=1, created="2026-01-01T00:00:01Z"),
            build_pod("second", whole=1, created="2026-01-01T00:00:02Z")]
    given = {"uid-first": {"main": (UUIDS[0],)}}
    assert _name(_find(pods, Kind.WHOLE, 1, given)) == "second"


def test_containers_are_matched_in_kubelet_order() -> None:
    pod = build_pod("p", whole=3, gpus="0,1,2", init={"setup": 1},
                    containers={"a": 1, "b": 2})
    found = _find([pod], Kind.WHOLE, 1)
    assert isinstance(found, Candidate) and found.container.name == "setup"
    found = _find([pod], Kind.WHOLE, 1, {"uid-p": {"setup": (UUIDS[0],)}})
    assert isinstance(found, Candidate) and found.container.name == "a"
    # b (2 GPUs) is next once a is done; a call for 1 finds nothing.
    done = {"uid-p": {"setup": (UUIDS[0],), "a": (UUIDS[0],)}}
    assert isinstance(_find([pod], Kind.WHOLE, 1, done), Refusal)
    found = _find([pod], Kind.WHOLE, 2, done)
    assert isinstance(found, Candidate) and found.container.name == "b"


def test_no_candidate_says_what_is_waiting() -> None:
    refusal = _find([build_pod("p", milli=500)], Kind.SHARE, 300)
    assert isinstance(refusal, Refusal)
    assert f"no pod on node {NODE} is waiting for 300 {RESOURCE_GPU_MILLI}" in refusal.message
    assert "default/p (500)" in refusal.message


def test_two_identical_requests_swap_when_the_kubelet_admits_the_younger_first() -> None:
    """The documented race: the call is attributed to the oldest candidate, whoever made it."""
    board = build_board()
    pods = [build_pod("old", milli=300, gpus="0", created="2026-01-01T00:00:01Z"),
            build_pod("young", milli=300, gpus="1", created="2026-01-01T00:00:01Z",
                      namespace="ns-b")]
    given: dict[str, dict[str, tuple[str, ...]]] = {}
    got = []
    for _ in range(2):  # the kubelet's two calls, whichever pod each was for
        found = _find(pods, Kind.SHARE, 300, given)
        assert isinstance(found, Candidate)
        gpus = resolve(found, board, DEFAULT_NAMES)
        assert not isinstance(gpus, Refusal)
        given[found.pod.uid] = {found.container.name: tuple(g.uuid for g in gpus)}
        got.append((found.pod.name, gpus[0].index))
    # Each GPU receives exactly the share the extender planned for it, whichever pod made the
    # call: per-GPU load is right; only the pod-to-GPU naming can swap.
    assert got == [("old", 0), ("young", 1)]


def test_the_oldest_is_never_skipped_for_a_younger_with_a_usable_annotation() -> None:
    pods = [build_pod("bad-annotation", whole=1, gpus="x", created="2026-01-01T00:00:01Z"),
            build_pod("fine", whole=1, gpus="1", created="2026-01-01T00:00:02Z")]
    found = _find(pods, Kind.WHOLE, 1)
    assert _name(found) == "bad-annotation"
    assert isinstance(found, Candidate)
    assert isinstance(resolve(found, build_board(), DEFAULT_NAMES), Refusal)


@pytest.mark.parametrize(("pod", "message"), [
    (build_pod("p", whole=1, gpus=None), "has no gpufrag.io/gpu-indices annotation, and this "
                                         "device plugin runs with --no-kubelet-fallback"),
    (build_pod("p", milli=300, gpus=None), "a share names no GPU, so only gpufrag-scheduler's "
                                           "bind, which records the GPU, can place it"),
    (build_pod("p", whole=1, gpus=""), "='', which is not comma-separated"),
    (build_pod("p", whole=1, gpus="a,b"), "'a,b', which is not comma-separated GPU indices"),
    (build_pod("p", whole=1, gpus="-1"), "'-1', which is not comma-separated"),
    (build_pod("p", whole=2, gpus="0"), "1 GPU(s) for a request of 2"),
    (build_pod("p", whole=2, gpus="1,1"), "a GPU named twice"),
    (build_pod("p", whole=1, gpus="4"), "GPU 4 does not exist on node gpu-node-1, which has 4"),
    (build_pod("p", whole=1, gpus="2"), "GPU 2 (GPU-2222"),
    (build_pod("p", whole=1, allocated="not json"), "allocation mark 'not json' is not"),
    (build_pod("p", milli=2500, gpus="0"), "cannot be placed"),
])
def test_annotations_that_cannot_be_honoured(pod: dict[str, object], message: str) -> None:
    board = build_board(unhealthy=[2])
    candidate = Candidate(ask(pod), ask(pod).containers[0])
    refusal = resolve(candidate, board, DEFAULT_NAMES)
    assert isinstance(refusal, Refusal)
    assert message in refusal.message, refusal.message
    assert refusal.pod is not None and refusal.pod.name == "p"


@pytest.mark.parametrize(("pod", "container", "indices"), [
    (build_pod("p", whole=2, gpus="3,1"), "main", (3, 1)),
    (build_pod("p", whole=3, gpus="0,2,3", containers={"a": 1, "b": 2}), "b", (2, 3)),
    (build_pod("p", whole=2, gpus="1,2", init={"i": 2}, containers={"a": 1, "b": 1}), "i",
     (1, 2)),
    (build_pod("p", whole=2, gpus="1,2", init={"i": 2}, containers={"a": 1, "b": 1}), "b",
     (2,)),
    (build_pod("p", milli=300, gpus="2"), "main", (2,)),
    (build_pod("p", milli=700, gpus="1", containers={"a": 300, "b": 400}), "b", (1,)),
    (build_pod("p", milli=2000, gpus="0,3", containers={"a": 1000, "b": 1000}), "b", (3,)),
])
def test_each_container_gets_its_slice_of_the_pods_gpus(pod: dict[str, object], container: str,
                                                         indices: tuple[int, ...]) -> None:
    parsed = ask(pod)
    target = next(c for c in parsed.containers if c.name == container)
    gpus = resolve(Candidate(parsed, target), build_board(), DEFAULT_NAMES)
    assert not isinstance(gpus, Refusal), gpus
    assert tuple(g.index for g in gpus) == indices


@pytest.mark.parametrize(("pod", "fallback", "takes"), [
    (build_pod("p", whole=1, gpus=None), True, True),
    (build_pod("p", whole=1, gpus=None), False, False),
    (build_pod("p", whole=1, gpus="0"), True, False),
    (build_pod("p", whole=1, gpus="x"), True, False),  # a wrong record is an error
    (build_pod("p", whole=1, gpus=""), True, False),
    (build_pod("p", milli=300, gpus=None), True, False),  # a share names no GPU
    (build_pod("p", milli=2000, gpus=None), True, False),
    (build_pod("p", whole=1, gpus=None, allocated="not json"), True, False),
])
def test_which_pods_take_the_kubelets_choice(pod: dict[str, object], fallback: bool,
                                             takes: bool) -> None:
    assert takes_kubelet_choice(ask(pod), kubelet_fallback=fallback) is takes


def test_holders_read_marks_the_plugins_record_and_promises() -> None:
    board = build_board()
    pods = [ask(build_pod("marked", milli=300, gpus="0", phase="Running",
                          allocated={"main": [UUIDS[0]]})),
            ask(build_pod("promised", whole=2, gpus="1,7")),  # 7: no such GPU, ignored
            ask(build_pod("kubelet", whole=1, gpus=None, uid="u-k")),
            ask(build_pod("going", whole=1, gpus="3", deleting=True))]
    held = holders(pods, board, {"u-k": {"main": (UUIDS[2],)}})
    assert held == {UUIDS[0]: ["default/marked"], UUIDS[1]: ["default/promised"],
                    UUIDS[2]: ["default/kubelet"]}
    assert idle_gpus(pods, board, {}) == (UUIDS[2], UUIDS[3])
    assert idle_gpus(pods, build_board(unhealthy=[3]), {}) == (UUIDS[2],)
