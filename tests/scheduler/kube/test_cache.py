"""ClusterCache: Kubernetes objects applied to a ClusterState the way the watch delivers them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpufrag.conventions import DEFAULT_NAMES, KubeNames
from node.dra.slices import build_slice
from node.gpus import Gpu
from scheduler.core.types import PodRequest
from scheduler.kube import cache as cache_module
from scheduler.kube.cache import ClusterCache, SkippedObject, request_inputs
from scheduler.kube.convert import node_to_k8s, pod_from_k8s, pod_to_k8s
from tests.builders import node, pod
from tests.scheduler.extender.helpers import FakeClock


def gpu_pod(name: str, at: str = "", gpus: tuple[int, ...] | None = None,
            **overrides: Any) -> dict[str, Any]:
    return pod_to_k8s(pod(name, **overrides), node=at, gpus=gpus)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def cache(clock: FakeClock) -> ClusterCache:
    c = ClusterCache(clock=clock)
    c.replace_nodes([node_to_k8s(node("n0", gpu_count=4)), node_to_k8s(node("n1"))])
    c.replace_pods([])
    return c


def free(cache: ClusterCache, name: str) -> list[int]:
    row = cache.state.index[name]
    return cache.state.gpu_free[row, : int(cache.state.gpu_count[row])].tolist()


def test_sync_flags(clock: FakeClock) -> None:
    c = ClusterCache(clock=clock)
    assert not c.synced
    c.replace_nodes([])
    assert not c.synced
    c.replace_pods([])
    assert c.synced


def test_bound_pod_takes_its_recorded_gpus_else_the_default_rule(cache: ClusterCache) -> None:
    cache.apply_pod(gpu_pod("a", "n0", (2,)))
    cache.apply_pod(gpu_pod("b", "n0"))                  # no annotation: lowest free GPU
    cache.apply_pod(gpu_pod("c", "n0", (9,)))            # out of range: default rule again
    assert cache.state.pods["default/a"].gpus == (2,)
    assert cache.state.pods["default/b"].gpus == (0,)
    assert cache.state.pods["default/c"].gpus == (1,)
    assert free(cache, "n0") == [0, 0, 0, 1000]


def test_a_node_heartbeat_changes_nothing(cache: ClusterCache) -> None:
    row = cache.state.index["n0"]
    version = int(cache.state.version[row])
    cache.apply_node(node_to_k8s(node("n0", gpu_count=4)))
    assert int(cache.state.version[row]) == version
    cache.apply_node(node_to_k8s(node("n0", gpu_count=4, cpu_milli=32_000)))
    assert int(cache.state.version[row]) > version
    assert int(cache.state.cpu_cap[row]) == 32_000


def test_pod_seen_before_its_node_is_placed_when_the_node_arrives(cache: ClusterCache) -> None:
    cache.apply_pod(gpu_pod("early", "n9", (1,)))
    assert "default/early" not in cache.state.pods
    assert cache.counts()["pods_unaccounted"] == 1
    cache.apply_node(node_to_k8s(node("n9", gpu_count=2)))
    assert cache.state.pods["default/early"].gpus == (1,)
    assert cache.counts()["pods_unaccounted"] == 0


def test_deleted_node_keeps_its_pods_until_they_go(cache: ClusterCache) -> None:
    cache.apply_pod(gpu_pod("a", "n0", (0,)))
    cache.delete_node("n0")
    assert not cache.state.active[cache.state.index["n0"]]
    assert "default/a" not in cache.state.pods
    cache.apply_node(node_to_k8s(node("n0", gpu_count=4)))  # it comes back
    assert cache.state.pods["default/a"].gpus == (0,)
    cache.delete_node("n0")
    cache.delete_pod("default/a")
    assert cache.counts()["pods_unaccounted"] == 0


def test_the_live_cluster_wins_over_capacity(cache: ClusterCache) -> None:
    for i in range(3):  # three whole-GPU pods on a 2-GPU node: over-committed, still counted
        cache.apply_pod(gpu_pod(f"p{i}", "n1"))
    assert len(cache.state.pods_on_node[cache.state.index["n1"]]) == 3
    cache.apply_pod(gpu_pod("huge", "n1", num_gpu=8))
    assert "default/huge" not in cache.state.pods
    assert cache.unaccounted["default/huge"] == "asks for 8 GPUs, node n1 has 2"


def test_terminal_and_deleted_pods_free_resources_and_start_the_warm_window(
        cache: ClusterCache, clock: FakeClock) -> None:
    obj = gpu_pod("m", "n0", (0,), model="llama", model_version="v1")
    cache.apply_pod(obj)
    assert cache.state.replicas[("llama", "v1")][0] == 1
    cache.apply_pod({**obj, "status": {"phase": "Succeeded"}})
    assert "default/m" not in cache.state.pods
    assert cache.state.model_last_seen[("llama", "v1")][0] == clock.now
    assert free(cache, "n0") == [1000] * 4


def test_a_bound_pods_gpus_cannot_be_moved_by_rewriting_its_record(cache: ClusterCache) -> None:
    """Only the bind records a pod's GPUs: a later change of ``gpu-indices`` on the running pod
    (a tenant moving its share in these books, so the GPU it really uses looks free) is not
    followed; the GPUs of the bind stay counted, and the change is counted and reported."""
    warnings: list[Any] = []
    cache.on_warning = warnings.append
    cache.apply_pod(gpu_pod("a", "n0", (0,)))
    changes = cache.pod_changes
    cache.apply_pod(gpu_pod("a", "n0", (0,)))  # the same again (a status update)
    assert cache.pod_changes == changes
    cache.apply_pod(gpu_pod("a", "n0", (3,)))  # rewritten by the pod's owner
    assert free(cache, "n0") == [0, 1000, 1000, 1000]
    assert cache.state.pods["default/a"].gpus == (0,)
    assert cache.record_changes == 1
    (warning,) = warnings
    assert (warning.key, warning.event_reason) == ("default/a", "GpufragRecordChanged")
    assert "changed after its bind, from 0 to 3" in warning.message
    cache.apply_pod(gpu_pod("a", "n0", None))  # or removed
    assert free(cache, "n0") == [0, 1000, 1000, 1000] and cache.record_changes == 2


def test_a_new_pod_of_the_same_name_takes_its_own_record(cache: ClusterCache) -> None:
    first = gpu_pod("a", "n0", (0,))
    first["metadata"]["uid"] = "uid-1"
    cache.apply_pod(first)
    cache.delete_pod("default/a")
    second = gpu_pod("a", "n0", (3,))
    second["metadata"]["uid"] = "uid-2"
    cache.apply_pod(second)
    assert free(cache, "n0") == [1000, 1000, 1000, 0] and cache.record_changes == 0


def test_relist_drops_what_is_gone_but_keeps_assumptions(cache: ClusterCache) -> None:
    cache.apply_pod(gpu_pod("stays", "n0", (0,)))
    cache.apply_pod(gpu_pod("goes", "n0", (1,)))
    pending = gpu_pod("pending")
    cache.apply_pod(pending)
    cache.assume(pod("pending", namespace="default"), cache.state.index["n0"], (2,))
    cache.replace_pods([gpu_pod("stays", "n0", (0,)), pending])
    assert set(cache.state.pods) == {"default/stays", "default/pending"}
    assert cache.counts()["pods_assumed"] == 1
    cache.replace_nodes([node_to_k8s(node("n0", gpu_count=4))])
    assert not cache.state.active[cache.state.index["n1"]]


def test_a_relist_frees_the_gpus_of_a_pod_whose_delete_the_watch_missed(
        cache: ClusterCache) -> None:
    """The drift a lost DELETED leaves: the pod holds its GPU in the cache only; the next full
    list (periodic: watch.relist_s) drops it, frees the GPU, and counts it."""
    cache.apply_pod(gpu_pod("kept", "n0", (0,)))
    cache.apply_pod(gpu_pod("deleted", "n0", (1,)))  # then deleted, its event never delivered
    assert free(cache, "n0")[:2] == [0, 0]
    assert cache.relist_dropped == {"node": 0, "pod": 0}
    cache.replace_pods([gpu_pod("kept", "n0", (0,))])
    assert free(cache, "n0")[:2] == [0, 1000]
    assert cache.relist_dropped == {"node": 0, "pod": 1}
    cache.replace_pods([gpu_pod("kept", "n0", (0,))])  # nothing missed since: nothing counted
    cache.replace_nodes([node_to_k8s(node("n0", gpu_count=4))])
    assert cache.relist_dropped == {"node": 1, "pod": 1}  # n1 was never said to be deleted


def test_unreadable_objects_are_skipped_with_the_reason(cache: ClusterCache) -> None:
    bad = gpu_pod("bad", "n0")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    cache.apply_pod(bad)
    assert "default/bad" not in cache.state.pods
    assert "'lots' is not a Kubernetes quantity" in cache.skipped["pod default/bad"].reason
    cache.apply_node({"metadata": {"name": "odd"}, "status": {"allocatable": {
        "nvidia.com/gpu": "1.5"}}})
    assert "odd" not in cache.state.index
    assert "not a whole number" in cache.skipped["node odd"].reason
    assert cache.skipped_counts() == {"node": 1, "pod": 1}


# What the API server stores (checked against a real one in tests/e2e/test_hardening.py):
# "1e100000" comes back as "10e99999", five thousand 9s as given.
PATHOLOGICAL = ["10e99999", "9" * 5000, "9" * 5000 + "e3"]


def unreadable_pod(name: str, quantity: str, *, resource: str = "nvidia.com/gpu", at: str = "",
                   uid: str = "") -> dict[str, Any]:
    body = gpu_pod(name, at)
    body["metadata"]["uid"] = uid or f"uid-{name}"
    resources = body["spec"]["containers"][0]["resources"]
    resources["requests"][resource] = quantity
    resources.setdefault("limits", {})[resource] = quantity
    return body


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "gpufrag.io/gpu-milli"])
@pytest.mark.parametrize("quantity", PATHOLOGICAL, ids=["exponent", "digits", "digits-e3"])
def test_a_pathological_quantity_is_left_out_and_reported(
        clock: FakeClock, quantity: str, resource: str) -> None:
    heard: list[SkippedObject] = []
    c = ClusterCache(clock=clock, on_skip=heard.append)
    c.replace_nodes([node_to_k8s(node("n0", gpu_count=4))])
    c.replace_pods([unreadable_pod("huge", quantity, resource=resource, at="n0")])
    assert "default/huge" not in c.state.pods and "default/huge" not in c.pods
    assert c.counts()["pods_placed"] == 0
    assert heard == [c.skipped["pod default/huge"]]
    assert (heard[0].kind, heard[0].namespace, heard[0].name, heard[0].uid) == (
        "Pod", "default", "huge", "uid-huge")
    assert resource in heard[0].reason and len(heard[0].reason) < 300  # quotes, bounded


def logged(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    return out + err


def test_a_skipped_pod_is_counted_once_logged_once_and_heard_every_time(
        clock: FakeClock, capsys: pytest.CaptureFixture[str]) -> None:
    heard: list[SkippedObject] = []
    c = ClusterCache(clock=clock, on_skip=heard.append)
    bad = unreadable_pod("bad", "10e99999")
    for _ in range(3):  # e.g. kube-scheduler updating its PodScheduled condition
        c.apply_pod(bad)
    assert len(heard) == 3  # the listener de-duplicates (by UID), so it may retry
    assert c.skips_total == {"node": 0, "pod": 1}
    assert logged(capsys).count("object skipped") == 1
    c.apply_pod(unreadable_pod("bad", "10e99999", uid="uid-recreated"))
    assert c.skips_total == {"node": 0, "pod": 1}  # the same object, re-created: logged again
    assert logged(capsys).count("object skipped") == 1
    assert c.skipped["pod default/bad"].uid == "uid-recreated"


def test_a_skip_is_forgotten_when_the_object_goes_or_reads_fine(cache: ClusterCache) -> None:
    cache.apply_pod(unreadable_pod("deleted", "9" * 5000))
    cache.apply_pod(unreadable_pod("done", "9" * 5000))
    cache.apply_pod(unreadable_pod("fixed", "9" * 5000))
    cache.apply_pod(unreadable_pod("unlisted", "9" * 5000))
    assert cache.skipped_counts()["pod"] == 4
    cache.delete_pod("default/deleted")
    done = unreadable_pod("done", "9" * 5000)
    done["status"] = {"phase": "Succeeded"}
    cache.apply_pod(done)
    cache.apply_pod(gpu_pod("fixed"))
    assert set(cache.skipped) == {"pod default/unlisted"}
    assert "default/fixed" in cache.pods
    cache.replace_pods([gpu_pod("fixed")])  # a relist without it
    assert cache.skipped == {}
    assert cache.skips_total["pod"] == 4  # the counter keeps what the gauge forgets


def test_a_node_that_turns_unreadable_leaves_the_state_until_it_reads_fine(
        cache: ClusterCache) -> None:
    cache.apply_pod(gpu_pod("on-n0", "n0", (1,)))
    broken = node_to_k8s(node("n0", gpu_count=4))
    broken["status"]["allocatable"]["nvidia.com/gpu"] = "9" * 5000
    cache.apply_node(broken)
    assert not cache.state.active[cache.state.index["n0"]]
    assert cache.skipped_counts() == {"node": 1, "pod": 0}
    assert cache.counts()["pods_unaccounted"] == 1  # waits as an orphan
    cache.apply_node(node_to_k8s(node("n0", gpu_count=4)))
    assert cache.skipped_counts()["node"] == 0
    assert free(cache, "n0") == [1000, 0, 1000, 1000]
    cache.apply_node(broken)
    cache.replace_nodes([node_to_k8s(node("n1"))])  # n0 is gone from the relist
    assert cache.skipped == {}
    cache.apply_node(broken)
    cache.delete_node("n0")
    assert cache.skipped == {}


def test_a_listener_that_raises_does_not_stop_the_apply(cache: ClusterCache) -> None:
    def broken(skipped: SkippedObject) -> None:
        raise RuntimeError("bug")

    cache.on_skip = broken
    cache.apply_pod(unreadable_pod("bad", "9" * 5000))
    cache.apply_pod(gpu_pod("good", "n0"))
    assert "pod default/bad" in cache.skipped and "default/good" in cache.state.pods


def test_expire_only_drops_unconfirmed_assumptions(cache: ClusterCache,
                                                   clock: FakeClock) -> None:
    cache.assume_ttl_s = 10
    cache.apply_pod(gpu_pod("a"))
    cache.apply_pod(gpu_pod("b"))
    cache.assume(pod("a", namespace="default"), 0, (0,))
    cache.assume(pod("b", namespace="default"), 0, (1,))
    cache.apply_pod(gpu_pod("b", "n0", (1,)))  # the watch shows b bound
    clock.advance(11)
    assert cache.expire() == ["default/a"]
    assert set(cache.state.pods) == {"default/b"}


def test_a_decision_is_confirmed_by_its_bind_and_restarts_its_ttl(cache: ClusterCache,
                                                                  clock: FakeClock) -> None:
    cache.assume_ttl_s = 10
    cache.apply_pod(gpu_pod("a"))
    cache.assume(pod("a", namespace="default"), 0, (2,), decided=True)
    assert cache.decided == {"default/a"} and cache.assumed_node("default/a") == "n0"
    clock.advance(8)
    cache.confirm("default/a")
    assert cache.decided == set()
    clock.advance(8)
    assert cache.expire() == []  # 16 s after the decision, 8 after the bind
    clock.advance(2)
    assert cache.expire() == ["default/a"] and cache.assumed_node("default/a") == ""


def test_a_decision_goes_with_the_watch_or_the_pod(cache: ClusterCache) -> None:
    for name in ("bound", "gone"):
        cache.apply_pod(gpu_pod(name))
        cache.assume(pod(name, namespace="default"), 0, (0,) if name == "bound" else (1,),
                     decided=True)
    cache.apply_pod(gpu_pod("bound", "n0", (0,)))  # the watch shows it bound
    cache.delete_pod("default/gone")
    assert cache.decided == set() and cache.assumed == {}
    assert set(cache.state.pods) == {"default/bound"}


def test_the_scheduler_name_is_kept_with_the_pod(cache: ClusterCache) -> None:
    theirs = pod_to_k8s(pod("theirs"), scheduler_name="other")
    unnamed = gpu_pod("unnamed")
    unnamed["spec"].pop("schedulerName", None)
    cache.apply_pod(theirs)
    cache.apply_pod(unnamed)
    assert cache.pods["default/theirs"].scheduler_name == "other"
    assert cache.pods["default/unnamed"].scheduler_name == ""


def _mutations() -> list[tuple[str, Any]]:
    """Each field ``pod_from_k8s`` reads, changed (path, new value)."""
    names = DEFAULT_NAMES
    return [
        ("spec.containers.0.resources", {"requests": {names.gpu: "2", "cpu": "1"}}),
        ("spec.containers.0.resources", {"limits": {names.gpu_milli: "250"}}),
        ("spec.initContainers", [{"name": "i", "resources": {"requests": {"cpu": "9"}}}]),
        ("spec.overhead", {"cpu": "3"}),
        (f"metadata.annotations.{names.annotation_gpu_spec}", "V100M32"),
        (f"metadata.labels.{names.label_model}", "resnet"),
        (f"metadata.labels.{names.label_model_version}", "2"),
    ]


def _set(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    *parents, last = path.split(".", 2) if path.startswith("metadata.") else path.split(".")
    at: Any = changed
    for part in parents:
        at = at[int(part)] if part.isdigit() else at.setdefault(part, {})
    at[last] = value
    return changed


@pytest.mark.parametrize(("path", "value"), _mutations())
def test_a_change_to_what_the_request_is_made_of_is_converted_again(
        cache: ClusterCache, path: str, value: Any) -> None:
    before = gpu_pod("a")
    cache.apply_pod(before)
    after = _set(before, path, value)
    assert request_inputs(after, DEFAULT_NAMES) != request_inputs(before, DEFAULT_NAMES)
    cache.apply_pod(after)
    assert cache.pods["default/a"].request == pod_from_k8s(after)
    assert cache.request_of(after) == pod_from_k8s(after)


def test_a_bind_or_status_update_reuses_the_request(cache: ClusterCache,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pending = gpu_pod("a", gpu_milli=500)
    cache.apply_pod(pending)
    request = cache.pods["default/a"].request
    converted: list[str] = []

    def counting(obj: dict[str, Any], names: KubeNames) -> PodRequest:
        converted.append("x")
        return pod_from_k8s(obj, names)

    monkeypatch.setattr(cache_module, "pod_from_k8s", counting)
    bound = gpu_pod("a", "n0", (1,), gpu_milli=500)
    bound["status"] = {"phase": "Running", "conditions": [{"type": "Ready"}]}
    bound["metadata"]["resourceVersion"] = "99"
    cache.apply_pod(bound)
    assert converted == []
    assert cache.pods["default/a"].request is request
    assert cache.state.pods["default/a"].gpus == (1,)
    assert cache.request_of(pending) is request  # the filter's copy of the pod
    cache.delete_pod("default/a")
    assert cache.request_of(pending) == request and converted == ["x"]  # gone: converted


def test_objects_not_shaped_like_json_are_left_to_the_converter(cache: ClusterCache) -> None:
    bad = gpu_pod("a")
    bad["spec"]["containers"] = {"not": "a list"}
    assert request_inputs(bad, DEFAULT_NAMES) is None
    cache.apply_pod(bad)
    assert "pod default/a" in cache.skipped
    assert request_inputs({"metadata": {"name": "a", "annotations": "x"}, "spec": {}},
                          DEFAULT_NAMES) is None
    assert request_inputs({"metadata": {"name": "a"}, "spec": {"overhead": {"cpu": 2**70}}},
                          DEFAULT_NAMES) is None


# ---------------------------------------------------------------------- DRA claims
DRA_DRIVER = "gpu.gpufrag.io"


def dra_pod(name: str, at: str, claim: str) -> dict[str, Any]:
    """A pod that asks no extended resource and gets its GPU through ResourceClaim ``claim``."""
    obj = gpu_pod(name, at, num_gpu=0)
    obj["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    obj["status"] = {**obj.get("status", {}),
                     "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}
    return obj


def dra_claim(name: str, *results: dict[str, Any]) -> dict[str, Any]:
    claim: dict[str, Any] = {"metadata": {"name": name, "namespace": "default"}, "status": {}}
    if results:
        claim["status"]["allocation"] = {"devices": {"results": list(results)}}
    return claim


def dra_result(device: str, pool: str = "n0", **consumed: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"request": "gpu", "driver": DRA_DRIVER, "pool": pool,
                             "device": device}
    if consumed:
        entry["consumedCapacity"] = consumed
    return entry


@pytest.fixture
def dra_cache(clock: FakeClock) -> ClusterCache:
    c = ClusterCache(clock=clock, dra_driver=DRA_DRIVER)
    c.replace_nodes([node_to_k8s(node("n0", gpu_count=4))])
    c.replace_pods([])
    c.replace_claims([])
    return c


def test_with_dra_the_cache_syncs_only_once_claims_slices_and_classes_are_listed(
        clock: FakeClock) -> None:
    c = ClusterCache(clock=clock, dra_driver=DRA_DRIVER)
    c.replace_nodes([])
    c.replace_pods([])
    assert not c.synced
    c.replace_claims([])
    assert not c.synced
    c.replace_slices([])
    assert not c.synced
    c.replace_device_classes([])
    assert c.synced


def test_a_pod_holds_the_share_of_the_gpu_its_claim_is_allocated(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_claim(dra_claim("c-a", dra_result("gpu-1", milli="250")))
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert dra_cache.state.pods["default/a"].gpus == (1,)
    assert free(dra_cache, "n0") == [1000, 750, 1000, 1000]


def test_a_claim_allocated_after_the_pod_is_seen_places_it_and_its_deletion_frees_it(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(dra_cache, "n0") == [1000] * 4
    claim = dra_claim("c-a", dra_result("gpu-1"), {**dra_result("nic-0"), "driver": "nic.x"})
    dra_cache.apply_claim(claim)
    assert free(dra_cache, "n0") == [1000, 0, 1000, 1000]
    dra_cache.delete_claim_object(claim)
    assert free(dra_cache, "n0") == [1000] * 4
    assert "default/a" in dra_cache.state.pods  # still running, holding no GPU


def test_a_deallocated_claim_or_one_a_relist_misses_frees_its_gpus(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_claim(dra_claim("c-a", dra_result("gpu-2", memory="1Gi")))
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(dra_cache, "n0") == [1000, 1000, 0, 1000]  # memory only: its milli unnamed
    dra_cache.apply_claim(dra_claim("c-a"))
    assert free(dra_cache, "n0") == [1000] * 4
    dra_cache.apply_claim(dra_claim("c-a", dra_result("gpu-3", milli="500")))
    assert free(dra_cache, "n0") == [1000, 1000, 1000, 500]
    dra_cache.replace_claims([])
    assert free(dra_cache, "n0") == [1000] * 4


def test_with_dra_off_claims_change_nothing(cache: ClusterCache) -> None:
    cache.apply_claim(dra_claim("c-a", dra_result("gpu-1", pool="n0")))
    cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(cache, "n0") == [1000] * 4
    assert cache.state.pods["default/a"].gpus == ()


def test_a_snapshot_load_with_dra_on_is_synced_and_reads_its_claims(clock: FakeClock) -> None:
    c = ClusterCache(clock=clock, dra_driver=DRA_DRIVER)
    c.load([node_to_k8s(node("n0", gpu_count=4))], [dra_pod("a", "n0", "c-a")],
           claims=[dra_claim("c-a", dra_result("gpu-0", milli="100"))])
    assert c.synced
    assert free(c, "n0") == [900, 1000, 1000, 1000]


# ---------------------------------------------------------------------- DRA: assumed first fit
def asking_claim(name: str, milli: int | None = None, *results: dict[str, Any]
                 ) -> dict[str, Any]:
    """Claim ``name`` asking one device of gpufrag's class (``milli`` of it; None: whole),
    allocated ``results`` (none: not allocated yet)."""
    claim = dra_claim(name, *results)
    capacity = {"capacity": {"requests": {"milli": str(milli)}}} if milli else {}
    claim["spec"] = {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER, **capacity}}]}}
    return claim


def test_a_pending_dra_pod_asks_what_its_claim_asks_and_holds_nothing_yet(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_pod(dra_pod("a", "", "c-a"))
    assert not dra_cache.pods["default/a"].request.wants_gpu  # its claim is not seen yet
    dra_cache.apply_claim(asking_claim("c-a", 250))
    known = dra_cache.pods["default/a"]
    assert (known.request.num_gpu, known.request.gpu_milli, known.gpus) == (1, 250, None)
    assert "default/a" not in dra_cache.state.pods
    assert [p.num_gpu for p in dra_cache.workload_pods()] == [1]  # FGD's target workload


def test_the_assumed_gpu_holds_through_the_bind_until_the_allocation_replaces_it(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_claim(asking_claim("c-a", 250))
    dra_cache.apply_pod(dra_pod("a", "", "c-a"))
    dra_cache.assume(dra_cache.pods["default/a"].request, 0, (0,), decided=True)
    # The watch shows the binding before the claim's allocation (two streams).
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(dra_cache, "n0") == [750, 1000, 1000, 1000]
    assert "default/a" in dra_cache.assumed and "default/a" not in dra_cache.decided
    # The allocator took another GPU than assumed: the allocation wins.
    dra_cache.apply_claim(asking_claim("c-a", 250, dra_result("gpu-2", milli="250")))
    assert free(dra_cache, "n0") == [1000, 1000, 750, 1000]
    assert "default/a" not in dra_cache.assumed
    assert dra_cache.state.pods["default/a"].gpus == (2,)


def test_an_allocation_seen_before_the_binding_is_held_on_its_node_then_for_real(
        dra_cache: ClusterCache) -> None:
    dra_cache.apply_pod(dra_pod("a", "", "c-a"))
    dra_cache.apply_claim(asking_claim("c-a", None, dra_result("gpu-1")))
    assert free(dra_cache, "n0") == [1000, 0, 1000, 1000]
    assert dra_cache.assumed_node("default/a") == "n0"  # until the binding shows
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(dra_cache, "n0") == [1000, 0, 1000, 1000]
    assert "default/a" not in dra_cache.assumed
    assert dra_cache.counts()["pods_placed"] == 1


def test_an_assumption_no_allocation_confirms_expires_to_cpu_only(
        dra_cache: ClusterCache, clock: FakeClock) -> None:
    dra_cache.apply_claim(asking_claim("c-a", 500))
    dra_cache.apply_pod(dra_pod("a", "", "c-a"))
    dra_cache.assume(dra_cache.pods["default/a"].request, 0, (0,))
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    clock.advance(dra_cache.assume_ttl_s)
    assert dra_cache.expire() == ["default/a"]
    assert free(dra_cache, "n0") == [1000] * 4
    placed = dra_cache.state.pods["default/a"]  # bound all the same: its CPU counts
    assert (placed.node, placed.gpus) == ("n0", ())


@pytest.mark.parametrize("bound", [False, True])
def test_an_assumption_goes_with_the_claim_or_the_pod(dra_cache: ClusterCache,
                                                      bound: bool) -> None:
    claim = asking_claim("c-a", 250)
    dra_cache.apply_claim(claim)
    dra_cache.apply_pod(dra_pod("a", "", "c-a"))
    dra_cache.assume(dra_cache.pods["default/a"].request, 0, (0,), decided=True)
    if bound:
        dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    dra_cache.delete_claim_object(claim)
    assert free(dra_cache, "n0") == [1000] * 4 and "default/a" not in dra_cache.assumed
    assert ("default/a" in dra_cache.state.pods) == bound  # a bound pod's CPU still counts
    dra_cache.apply_claim(claim)
    if not bound:
        dra_cache.assume(dra_cache.pods["default/a"].request, 0, (1,))
    dra_cache.delete_pod("default/a")
    assert free(dra_cache, "n0") == [1000] * 4 and not dra_cache.assumed
    assert "default/a" not in dra_cache.state.pods


def test_a_filter_waits_for_the_claims_of_its_pod(dra_cache: ClusterCache) -> None:
    dra_cache.apply_pod({**dra_pod("a", "", "c-a"), "metadata": {
        "name": "a", "namespace": "default", "uid": "uid-a"}})
    assert not dra_cache.await_pod("default/a", "uid-a", 0.0, ["default/c-a"])
    dra_cache.apply_claim(asking_claim("c-a", 250))
    assert dra_cache.await_pod("default/a", "uid-a", 0.0, ["default/c-a"])


def test_a_node_the_device_plugin_left_has_the_gpus_of_its_slice(clock: FakeClock) -> None:
    c = ClusterCache(clock=clock, dra_driver=DRA_DRIVER)
    gpus = [Gpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81_920) for i in range(2)]
    published = build_slice("n0", DRA_DRIVER, gpus, {})
    c.replace_slices([published])  # the slice may come before its node
    assert not c.synced  # nodes, pods, claims and classes not listed yet
    c.replace_nodes([node_to_k8s(node("n0", gpu_count=0, gpu_product=""))])
    c.replace_pods([])
    c.replace_claims([])
    c.replace_device_classes([])
    assert c.synced
    row = c.state.index["n0"]
    assert (int(c.state.gpu_count[row]), int(c.state.gpu_memory_mib[row])) == (2, 81_920)
    c.apply_claim(dra_claim("c-a", dra_result("gpu-1", milli="250")))
    c.apply_pod(dra_pod("a", "n0", "c-a"))
    assert free(c, "n0") == [1000, 750]
    c.delete_slice_object(published)  # the driver left too: no GPU there
    assert int(c.state.gpu_count[row]) == 0
    c.apply_slice(published)
    assert int(c.state.gpu_count[row]) == 2
    c.replace_slices([])
    assert int(c.state.gpu_count[row]) == 0


def test_a_claim_moves_only_the_pods_that_use_it_now(dra_cache: ClusterCache) -> None:
    dra_cache.apply_claim(dra_claim("c-a", dra_result("gpu-0")))
    dra_cache.apply_claim(dra_claim("c-b", dra_result("gpu-1")))
    dra_cache.apply_pod(dra_pod("a", "n0", "c-a"))
    dra_cache.apply_pod(dra_pod("a", "n0", "c-b"))  # its status now names another claim
    assert free(dra_cache, "n0") == [1000, 0, 1000, 1000]
    dra_cache.apply_claim(dra_claim("c-a", dra_result("gpu-2")))
    assert free(dra_cache, "n0") == [1000, 0, 1000, 1000]
    dra_cache.delete_pod("default/a")
    dra_cache.apply_claim(dra_claim("c-b", dra_result("gpu-3")))
    assert free(dra_cache, "n0") == [1000] * 4


MAPPED_RESOURCE = "gpufrag.io/dra-gpu"


def mapped_class(name: str = "whole.gpu.gpufrag.io",
                 resource: str | None = MAPPED_RESOURCE) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": []}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": spec}


def mapped_gpu_pod(name: str, at: str = "") -> dict[str, Any]:
    """A pod asking one GPU through the mapped extended resource, with no claim yet."""
    obj = gpu_pod(name, at, num_gpu=0)
    obj["spec"]["containers"][0]["resources"].setdefault("limits", {})[MAPPED_RESOURCE] = "1"
    return obj


def test_only_the_drivers_classes_map_extended_resources_to_its_gpus(
        dra_cache: ClusterCache) -> None:
    dra_cache.replace_device_classes([mapped_class(), mapped_class("other.example.com",
                                                                   "example.com/gpu")])
    assert dra_cache.mapped == {"whole.gpu.gpufrag.io": MAPPED_RESOURCE}
    assert dra_cache.mapped_ask(mapped_gpu_pod("a")) == 1
    dra_cache.apply_device_class(mapped_class(resource=None))  # the mapping taken off
    assert dra_cache.mapped == {}
    assert dra_cache.mapped_ask(mapped_gpu_pod("a")) == 0
    dra_cache.apply_device_class(mapped_class())
    dra_cache.delete_device_class_object(mapped_class())
    assert dra_cache.mapped == {}


def test_a_mapped_pod_bound_by_the_extender_holds_its_assumed_gpu_until_its_claim_shows(
        dra_cache: ClusterCache) -> None:
    """Before kube-scheduler makes its claim, a pod asking the mapped resource asks a whole
    GPU: the extender's assumption stands for it once it is bound; when its status names the
    claim kube-scheduler made, the claim's allocation replaces the assumption."""
    dra_cache.replace_device_classes([mapped_class()])
    request = dra_cache.claims_request(PodRequest("a", namespace="default"), (), 1)
    assert (request.num_gpu, request.gpu_milli) == (1, 1000)
    dra_cache.apply_pod(mapped_gpu_pod("a"))
    assert dra_cache.mapped_of("default/a") == 1
    dra_cache.assume(dra_cache.pods["default/a"].request, dra_cache.state.index["n0"], (0,))
    dra_cache.apply_pod(mapped_gpu_pod("a", "n0"))  # bound, its claim not shown yet
    assert dra_cache.state.pods["default/a"].gpus == (0,)
    assert free(dra_cache, "n0") == [0, 1000, 1000, 1000]
    dra_cache.apply_claim(dra_claim("a-extended", dra_result("gpu-2")))
    made = mapped_gpu_pod("a", "n0")
    made["status"] = {**made.get("status", {}),
                      "extendedResourceClaimStatus": {"resourceClaimName": "a-extended"}}
    dra_cache.apply_pod(made)
    assert dra_cache.mapped_of("default/a") == 0
    assert dra_cache.state.pods["default/a"].gpus == (2,)
    assert "default/a" not in dra_cache.assumed
    assert free(dra_cache, "n0") == [1000, 1000, 0, 1000]


def test_a_memory_share_claim_counts_the_larger_part_of_its_gpu(clock: FakeClock) -> None:
    """The admission webhook turns ``gpu-memory-mib: 10240`` into a claim for 1 milli and
    10 GiB of memory: the cache counts it as a device-plugin memory share is counted, for the
    larger of its milli and its memory's part of the GPU (a quarter of a 40 GiB GPU), both
    while it waits (what its claim asks) and once allocated (what it consumed)."""
    c = ClusterCache(clock=clock, dra_driver=DRA_DRIVER)
    c.replace_nodes([node_to_k8s(node("n0", gpu_count=2, gpu_memory_mib=40_960))])
    c.replace_pods([])
    c.replace_claims([])
    c.replace_device_classes([])
    claim = dra_claim("c-m")
    claim["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DRA_DRIVER,
        "capacity": {"requests": {"milli": "1", "memory": "10Gi"}}}}]}}
    asked = c.claims_request(PodRequest("m", namespace="default"), ())
    assert asked.num_gpu == 0
    c.apply_claim(claim)
    asked = c.claims_request(PodRequest("m", namespace="default"), ("default/c-m",))
    assert (asked.num_gpu, asked.gpu_milli, asked.gpu_memory_mib) == (1, 1, 10_240)
    assert asked.milli_on(40_960) == 250
    claim["status"] = {"allocation": {"devices": {"results": [
        dra_result("gpu-1", milli="1", memory="10Gi")]}}}
    c.apply_claim(claim)
    c.apply_pod(dra_pod("m", "n0", "c-m"))
    assert free(c, "n0") == [1000, 750]
