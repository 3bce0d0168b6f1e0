"""Allocate, GetPreferredAllocation and PreStartContainer decisions, without gRPC."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from gpufrag.conventions import RESOURCE_GPU, RESOURCE_GPU_MEMORY_MIB
from node.deviceplugin.allocator import AllocationRefused
from node.deviceplugin.api import pb
from node.deviceplugin.config import ANNOTATION_GPU_ALLOCATED, Kind
from node.deviceplugin.devices import gpu_of, share_id
from tests.node.deviceplugin.builders import UUIDS, build_pod
from tests.node.deviceplugin.fakes import Setup, build_allocator


def _ids(kind: Kind, gpu: int, count: int) -> list[str]:
    if kind is Kind.WHOLE:
        return list(UUIDS[gpu:gpu + count])
    return [share_id(UUIDS[gpu], slot) for slot in range(count)]


def test_whole_gpus_name_exactly_the_chosen_uuids_and_device_nodes() -> None:
    setup = build_allocator([build_pod("p", whole=2, gpus="3,1")])
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[0], UUIDS[2]])  # the kubelet's picks
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}"}
    assert [(d.host_path, d.container_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidia3", "/dev/nvidia3", "rw"), ("/dev/nvidia1", "/dev/nvidia1", "rw"),
        ("/dev/nvidiactl", "/dev/nvidiactl", "rw"), ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw")]
    assert setup.writer.marks == [("default/p", ANNOTATION_GPU_ALLOCATED,
                                   {"main": (UUIDS[3], UUIDS[1])})]


def test_device_nodes_that_do_not_exist_are_left_out() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="2")], devices=())
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[2]])
    assert list(response.devices) == []
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2]}


def test_a_pods_containers_are_marked_together() -> None:
    setup = build_allocator([build_pod("p", whole=2, gpus="0,1", containers={"a": 1, "b": 1})])
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])
    assert [m[2] for m in setup.writer.marks] == [
        {"a": (UUIDS[0],)}, {"a": (UUIDS[0],), "b": (UUIDS[1],)}]


def test_a_share_without_mps_gets_soft_limits_only() -> None:
    setup = build_allocator([build_pod("p", milli=300, gpus="2")])
    response = setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 0, 300))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2],
                                   "GPUFRAG_GPU_MILLI": "300",
                                   "GPUFRAG_GPU_MEMORY_LIMIT_MIB": "24576"}


def _with_memory(obj: dict[str, object], mib: int) -> dict[str, object]:
    limits = obj["spec"]["containers"][0]["resources"]["limits"]  # type: ignore[index]
    limits[RESOURCE_GPU_MEMORY_MIB] = str(mib)
    return obj


@pytest.mark.parametrize(("kind", "pod"), [
    (Kind.SHARE, lambda: build_pod("p", milli=1, gpus="2")),  # gpu-milli 1: the carrier
    (Kind.WHOLE, lambda: build_pod("p", whole=1, gpus="2")),  # HAMi's nvidia.com/gpu: 1
])
def test_a_memory_share_gets_the_memory_it_asked_and_the_compute_placement_counts(
        kind: Kind, pod: Any) -> None:
    setup = build_allocator([_with_memory(pod(), 6000)], mps=True)
    response = setup.allocator.allocate(kind, _ids(kind, 2, 1))
    envs = dict(response.envs)
    # placement counts 6,000 MiB of an 81,920 MiB GPU as 74 milli (rounded up)
    assert (envs["NVIDIA_VISIBLE_DEVICES"], envs["GPUFRAG_GPU_MILLI"],
            envs["GPUFRAG_GPU_MEMORY_LIMIT_MIB"]) == (UUIDS[2], "74", "6000")
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6000M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "8"


def test_a_share_with_mps_gets_cuda_mps_limits_from_its_share() -> None:
    setup = build_allocator([build_pod("p", milli=333, gpus="1")], mps=True,
                            mps_pipe_dir="/run/nvidia/mps")
    response = setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 1, 333))
    envs = dict(response.envs)
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "34"  # rounded up
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={81_920 * 333 // 1000}M"
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia/mps"
    assert [(m.host_path, m.container_path) for m in response.mounts] == [
        ("/run/nvidia/mps", "/run/nvidia/mps")]


def test_whole_gpus_asked_as_milli_get_no_share_limits() -> None:
    setup = build_allocator([build_pod("p", milli=2000, gpus="0,3")], mps=True)
    response = setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 0, 2000))
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[0]},{UUIDS[3]}"}


def test_a_refusal_reaches_the_kubelet_and_the_pod_as_an_event() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="x")])
    with pytest.raises(AllocationRefused, match="which is not comma-separated GPU indices"):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    assert [w[0] for w in setup.writer.warnings] == ["default/p"]
    assert setup.writer.marks == []


def test_a_pod_the_cache_has_not_seen_yet_is_found_by_one_relist() -> None:
    setup = build_allocator([])
    setup.pods.listed = [build_pod("just-bound", whole=1, gpus="1")]
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    assert dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert setup.pods.relists == 1


def test_no_pod_and_no_api_server_is_a_refusal_not_a_crash() -> None:
    setup = build_allocator([])
    setup.pods.relist_error = ConnectionError("refused")
    with pytest.raises(AllocationRefused, match="no pod on node gpu-node-1 is waiting for 1"):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])


def test_a_failed_mark_still_gives_the_gpus_and_the_record_guards_the_pod() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="1")])
    setup.writer.fail_marks = True
    response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])
    assert dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert setup.metrics.mark_errors._value.get() == 1
    with pytest.raises(AllocationRefused):  # the same pod is not matched twice
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])


def test_forget_drops_the_record_of_a_pod_that_is_gone() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="1")])
    setup.writer.fail_marks = True
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])
    setup.allocator.forget("uid-p")
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])  # (re-created pod with the same UID)


def test_preferred_allocation_steers_the_kubelet_to_the_chosen_gpu() -> None:
    setup = build_allocator([build_pod("p", milli=3, gpus="2")])
    available = [share_id(u, s) for u in UUIDS for s in range(5)]
    request = pb.ContainerPreferredAllocationRequest(available_deviceIDs=available,
                                                     allocation_size=3)
    chosen = setup.allocator.preferred(Kind.SHARE, request)
    assert chosen == [share_id(UUIDS[2], s) for s in range(3)]
    assert setup.writer.marks == []  # a preference allocates nothing


def test_preferred_allocation_keeps_must_include_and_falls_back_to_the_kubelets_order() -> None:
    setup = build_allocator([build_pod("p", whole=2, gpus="x")])  # unusable annotation
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=[UUIDS[3], UUIDS[1], UUIDS[2]], must_include_deviceIDs=[UUIDS[3]],
        allocation_size=2)
    assert setup.allocator.preferred(Kind.WHOLE, request) == [UUIDS[3], UUIDS[1]]
    assert setup.writer.warnings == []  # Allocate, not the preference, reports the problem


def test_prestart_refuses_a_gpu_that_failed_after_allocate() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus="1")])
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])  # the kubelet's ID differs: remembered
    setup.allocator.prestart([UUIDS[0]])
    setup.board.set(UUIDS[1], False, "GPU 1: GPU is lost")
    with pytest.raises(AllocationRefused, match="GPU 1 .* became unhealthy after it was"):
        setup.allocator.prestart([UUIDS[0]])


def test_prestart_after_a_plugin_restart_reads_the_gpus_from_the_device_ids() -> None:
    setup = build_allocator([], unhealthy=[2])
    setup.allocator.prestart([share_id(UUIDS[0], 1)])
    with pytest.raises(AllocationRefused, match="GPU 2"):
        setup.allocator.prestart([share_id(UUIDS[2], 7)])


def test_identical_calls_at_once_never_share_a_pod() -> None:
    pods = [build_pod(f"p{i}", milli=100, gpus=str(i % 4), created=f"2026-01-01T00:00:{i:02d}Z")
            for i in range(8)]
    setup = build_allocator(pods)
    barrier = threading.Barrier(8)
    got: list[str] = []

    def call() -> None:
        barrier.wait()
        response = setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 0, 100))
        got.append(dict(response.envs)["NVIDIA_VISIBLE_DEVICES"])

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(m[0] for m in setup.writer.marks) == [f"default/p{i}" for i in range(8)]
    assert sorted(got) == sorted(UUIDS * 2)
    assert all(gpu_of(u) == u for u in got)


# -- pods gpufrag-scheduler's bind did not place (no gpu-indices record) -----------------------
def _sources(setup: Setup) -> dict[str, float]:
    return {source: setup.metrics.allocated_containers.labels(RESOURCE_GPU, source)._value.get()
            for source in ("record", "kubelet")}


def test_a_whole_gpu_pod_with_no_record_gets_the_devices_the_kubelet_chose() -> None:
    setup = build_allocator([build_pod("default-sched", whole=2, gpus=None)])
    with capture_logs() as logs:
        response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[3], UUIDS[1]])
    assert dict(response.envs) == {"NVIDIA_VISIBLE_DEVICES": f"{UUIDS[1]},{UUIDS[3]}"}
    assert [d.host_path for d in response.devices] == [
        "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    assert setup.writer.marks == [("default/default-sched", ANNOTATION_GPU_ALLOCATED,
                                   {"main": (UUIDS[1], UUIDS[3])})]
    assert setup.writer.warnings == []
    assert _sources(setup) == {"record": 0, "kubelet": 1}
    assert [e["event"] for e in logs] == ["kubelet_choice", "allocated"]
    assert logs[1]["source"] == "kubelet"


def test_the_kubelet_choice_is_logged_once_per_pod_and_counted_per_container() -> None:
    setup = build_allocator([build_pod("p", whole=2, gpus=None, containers={"a": 1, "b": 1}),
                             build_pod("q", whole=1, gpus="2", created="2026-01-02T00:00:00Z")])
    with capture_logs() as logs:
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]])
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[2]])  # q: the record
    assert [e["pod"] for e in logs if e["event"] == "kubelet_choice"] == ["default/p"]
    assert _sources(setup) == {"record": 1, "kubelet": 2}
    assert setup.writer.marks[1][2] == {"a": (UUIDS[0],), "b": (UUIDS[1],)}


@pytest.mark.parametrize(("device_ids", "message"), [
    ([UUIDS[2]], f"GPU 2 ({UUIDS[2]}), chosen for it by the kubelet, is unhealthy (GPU 2:"),
    (["GPU-not-on-this-node"], "the kubelet chose device 'GPU-not-on-this-node', which is not "
                               "a GPU of node gpu-node-1"),
    ([share_id(UUIDS[0], 1)], "which is not a GPU of node"),
    ([UUIDS[0], UUIDS[0]], "named GPU 0"),
])
def test_a_kubelet_choice_that_is_unhealthy_or_unknown_is_refused(
        device_ids: list[str], message: str) -> None:
    setup = build_allocator([build_pod("p", whole=len(device_ids), gpus=None)], unhealthy=[2])
    with pytest.raises(AllocationRefused) as refused:
        setup.allocator.allocate(Kind.WHOLE, device_ids)
    assert message in str(refused.value), refused.value
    assert [w[0] for w in setup.writer.warnings] == ["default/p"]
    assert setup.writer.marks == []
    assert _sources(setup) == {"record": 0, "kubelet": 0}


def test_a_share_pod_with_no_record_is_refused_it_needs_the_bind() -> None:
    setup = build_allocator([build_pod("p", milli=300, gpus=None)])
    with pytest.raises(AllocationRefused) as refused:
        setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 0, 300))
    assert ("pod default/p asks gpufrag.io/gpu-milli and has no gpufrag.io/gpu-indices "
            "annotation: a share names no GPU, so only gpufrag-scheduler's bind") in \
        str(refused.value)
    assert setup.writer.marks == []


@pytest.mark.parametrize(("gpus", "message"), [
    ("zero", "which is not comma-separated GPU indices"),
    ("", "which is not comma-separated GPU indices"),
    ("0,1", "2 GPU(s) for a request of 1"),
    ("9", "GPU 9 does not exist on node gpu-node-1"),
    ("2", "chosen for it by the extender, is unhealthy"),
])
def test_a_wrong_record_is_refused_never_replaced_by_the_kubelets_choice(
        gpus: str, message: str) -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus=gpus)], unhealthy=[2])
    with pytest.raises(AllocationRefused, match=re.escape(message)):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])  # a healthy device the kubelet chose
    assert setup.writer.marks == []


def test_without_kubelet_fallback_a_pod_with_no_record_is_refused() -> None:
    setup = build_allocator([build_pod("p", whole=1, gpus=None)], kubelet_fallback=False)
    with pytest.raises(AllocationRefused, match="runs with --no-kubelet-fallback"):
        setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])


def test_preferred_allocation_for_a_pod_with_no_record_takes_the_lowest_idle_gpus() -> None:
    """GPU 0 holds a share, GPU 1 is promised to a pod the kubelet has not admitted yet, GPU 2
    is unhealthy: the kubelet is steered to GPU 3, then to what it offers."""
    setup = build_allocator([
        build_pod("share", milli=300, gpus="0", phase="Running", allocated={"main": [UUIDS[0]]}),
        build_pod("recorded", whole=1, gpus="1", created="2026-01-02T00:00:00Z"),
        build_pod("default-sched", whole=2, gpus=None)], unhealthy=[2])
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=[UUIDS[0], UUIDS[1], UUIDS[3]], allocation_size=2)
    assert setup.allocator.preferred(Kind.WHOLE, request) == [UUIDS[3], UUIDS[0]]


def test_a_kubelet_choice_on_a_gpu_others_hold_is_given_and_warned() -> None:
    """The kubelet counts whole GPUs and shares apart, so it can hand a whole GPU that holds a
    share; the pod is not refused (its scheduler saw a free GPU), the overlap is logged."""
    setup = build_allocator([
        build_pod("share", milli=300, gpus="0", phase="Running", allocated={"main": [UUIDS[0]]}),
        build_pod("default-sched", whole=1, gpus=None)])
    with capture_logs() as logs:
        response = setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    assert dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]
    overlap = [e for e in logs if e["event"] == "kubelet_choice_in_use"]
    assert [(e["uuid"], e["held_by"]) for e in overlap] == [(UUIDS[0], ["default/share"])]


# ----------------------------------------------------------------------- locks and callbacks

def _within(seconds: float, call: Any) -> Any:
    """``call()`` in a thread; fails (instead of hanging the suite) if it is not back in time."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s: a lock taken twice?"
    return result[0]


def test_a_relist_that_finds_a_pod_gone_does_not_lock_the_allocator() -> None:
    """The relist's gone-callback (forget) takes the allocator's lock, as the CLI wires it:
    so the relist runs outside the lock, and every later call still answers."""
    setup = build_allocator([build_pod("gone", whole=1, gpus="0")])
    setup.allocator.allocate(Kind.WHOLE, [UUIDS[0]])
    setup.pods.listed = [build_pod("new", whole=1, gpus="1")]  # "gone" ended meanwhile
    _within(5, lambda: setup.allocator.allocate(Kind.WHOLE, [UUIDS[1]]))
    assert setup.pods.relists == 1
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=list(UUIDS), must_include_deviceIDs=[], allocation_size=1)
    _within(5, lambda: setup.allocator.preferred(Kind.WHOLE, request))


def test_a_relist_that_hangs_holds_no_lock_other_calls_need() -> None:
    """The network read of one call (a relist to an API server that accepts and never
    answers until the client's deadline) does not hold up another call's decision."""
    setup = build_allocator([build_pod("cached", whole=1, gpus="2")])
    entered, release = threading.Event(), threading.Event()

    def hanging_relist() -> None:
        entered.set()
        release.wait(10)

    setup.pods.relist = hanging_relist  # type: ignore[method-assign]
    stuck = threading.Thread(target=lambda: _refused(setup), daemon=True)
    stuck.start()
    assert entered.wait(5)
    try:
        response = _within(5, lambda: setup.allocator.allocate(Kind.WHOLE, [UUIDS[2]]))
        assert dict(response.envs)["NVIDIA_VISIBLE_DEVICES"] == UUIDS[2]
    finally:
        release.set()
        stuck.join(5)


def _refused(setup: Setup) -> None:
    with pytest.raises(AllocationRefused):
        setup.allocator.allocate(Kind.SHARE, _ids(Kind.SHARE, 0, 100))  # no pod asks this
